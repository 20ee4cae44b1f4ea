package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
)

const benchNode = "bench-node"

type nodeDaemon struct {
	cmd  *exec.Cmd
	ipam nodev1.IPAMServiceClient
	conn *grpc.ClientConn
}

func startNodeDaemon(b *testing.B, bin, kubeconfig, dir string) (*nodeDaemon, time.Duration) {
	b.Helper()
	return startNodeDaemonArgs(b, bin, kubeconfig, dir, "--cni-skip-nv-ipam-binary-copy", "--cni-skip-nv-ipam-config-creation")
}

func startNodeDaemonArgs(b *testing.B, bin, kubeconfig, dir string, extra ...string) (*nodeDaemon, time.Duration) {
	b.Helper()
	return startNodeDaemonOn(b, bin, kubeconfig, dir, benchNode, "default", extra...)
}

// startNodeDaemonOn starts ipam-node as node for the pools of namespace, its store
// and socket in dir, and returns once its gRPC socket serves, with the time since
// its exec.
func startNodeDaemonOn(b *testing.B, bin, kubeconfig, dir, node, namespace string, extra ...string) (*nodeDaemon, time.Duration) {
	b.Helper()
	sock := filepath.Join(dir, "daemon.sock")
	start := time.Now()
	args := append([]string{"--node-name", node, "--kubeconfig", kubeconfig, "--ippools-namespace", namespace,
		"--store-file", filepath.Join(dir, "store"), "--bind-address", "unix://" + sock,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--cleanup-interval", "0"}, extra...)
	cmd := exec.Command(bin, args...)
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	// Wait for the socket, then probe with short-lived connections so that gRPC's
	// reconnect backoff does not inflate the start-up time.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if time.Now().After(deadline) {
			b.Fatal("ipam-node did not serve within 5 minutes")
		}
		if _, err := os.Stat(sock); err != nil {
			time.Sleep(2 * time.Millisecond)
			continue
		}
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = nodev1.NewIPAMServiceClient(conn).IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: benchParams("startup-probe")}, grpc.WaitForReady(false))
		cancel()
		_ = conn.Close()
		if err == nil || !isUnavailable(err) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	d := &nodeDaemon{cmd: cmd, conn: conn, ipam: nodev1.NewIPAMServiceClient(conn)}
	return d, time.Since(start)
}

// waitForPool waits until the daemon has synced the bench pool from the API.
func (d *nodeDaemon) waitForPool(b *testing.B) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := d.ipam.Allocate(context.Background(), &nodev1.AllocateRequest{Parameters: benchParams("pool-probe")})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the bench pool did not sync within a minute: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := d.ipam.Deallocate(context.Background(), &nodev1.DeallocateRequest{Parameters: benchParams("pool-probe")}); err != nil {
		b.Fatal(err)
	}
}

func (d *nodeDaemon) stop() {
	_ = d.conn.Close()
	_ = d.cmd.Process.Signal(os.Interrupt)
	_ = d.cmd.Wait()
}

func isUnavailable(err error) bool {
	return err != nil && (grpcCode(err) == "Unavailable" || grpcCode(err) == "DeadlineExceeded")
}

func benchParams(cid string) *nodev1.IPAMParameters {
	return &nodev1.IPAMParameters{Pools: []string{"bench"}, CniContainerid: cid, CniIfname: "net1",
		Metadata: &nodev1.IPAMMetadata{K8SPodName: "pod-" + cid, K8SPodNamespace: "default"}}
}

// fill allocates n addresses with 64 concurrent clients.
func fill(b *testing.B, d *nodeDaemon, prefix string, n int) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if _, err := d.ipam.Allocate(context.Background(), &nodev1.AllocateRequest{
					Parameters: benchParams(fmt.Sprintf("%s-%d", prefix, i))}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("filling: %v", err)
	}
}

// concurrently runs op for 0..total-1 on clients goroutines and returns the
// operations per second.
func concurrently(b *testing.B, clients, total int, op func(i int) error) float64 {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= total {
					return
				}
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds()
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// BenchmarkNodeDaemon measures the ipam-node binary over its unix socket:
// sequential Allocate latency at 0%, 50% and 99% fill of a 65,536-address block,
// concurrent Allocate throughput with 16 and 64 clients, then the daemon's RSS with
// 100,000 live allocations (current and peak, after filling them over gRPC), its
// start-up time over that store, and its RSS once the restarted daemon serves.
func BenchmarkNodeDaemon(b *testing.B) {
	cp := harness.StartControlPlane(b, harness.ControlPlaneOptions{})
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: benchNode}}); err != nil {
		b.Fatal(err)
	}
	kubeconfig, err := cp.WriteKubeconfig(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	bin := harness.BuildBinary(b, "./cmd/ipam-node")
	setBlock := func(start, end string) {
		var p v1alpha1.IPPool
		err := cp.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "bench"}, &p)
		if err != nil {
			p = v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "default"},
				Spec: v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/8", PerNodeBlockSize: 65536}}
			if err := cp.Client.Create(ctx, &p); err != nil {
				b.Fatal(err)
			}
		}
		p.Status.Allocations = []v1alpha1.Allocation{{NodeName: benchNode, StartIP: start, EndIP: end}}
		if err := cp.Client.Status().Update(ctx, &p); err != nil {
			b.Fatal(err)
		}
	}

	b.Run("sequential", func(b *testing.B) {
		setBlock("10.0.0.1", "10.1.0.0") // 65,536 addresses
		d, _ := startNodeDaemon(b, bin, kubeconfig, b.TempDir())
		defer d.stop()
		d.waitForPool(b)
		filled := 0
		for _, level := range []float64{0, 0.5, 0.99} {
			target := int(level * 65536)
			fill(b, d, fmt.Sprintf("fill%d", target), target-filled)
			filled = target
			b.Run(fmt.Sprintf("fill=%.0f%%", level*100), func(b *testing.B) {
				const n = 500
				lat := make([]time.Duration, 0, n)
				for i := range n {
					cid := fmt.Sprintf("seq-%d-%d", target, i)
					t0 := time.Now()
					if _, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: benchParams(cid)}); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
					if _, err := d.ipam.Deallocate(ctx, &nodev1.DeallocateRequest{Parameters: benchParams(cid)}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(percentile(lat, 0.5).Microseconds()), "p50-µs")
				b.ReportMetric(float64(percentile(lat, 0.99).Microseconds()), "p99-µs")
			})
		}
	})

	b.Run("concurrent", func(b *testing.B) {
		setBlock("10.0.0.1", "10.1.0.0")
		d, _ := startNodeDaemon(b, bin, kubeconfig, b.TempDir())
		defer d.stop()
		d.waitForPool(b)
		for _, clients := range []int{16, 64} {
			b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
				rate := concurrently(b, clients, 8000, func(i int) error {
					_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: benchParams(fmt.Sprintf("c%d-%d", clients, i))})
					return err
				})
				b.ReportMetric(rate, "allocs/s")
			})
		}
	})

	b.Run("100k", func(b *testing.B) {
		setBlock("10.0.0.1", "10.4.0.0") // 262,144 addresses
		dir := b.TempDir()
		d, _ := startNodeDaemon(b, bin, kubeconfig, dir)
		d.waitForPool(b)
		fill(b, d, "big", 100000)
		rss := peakRSSKiB(b, d.cmd.Process.Pid)
		current := currentRSSKiB(b, d.cmd.Process.Pid)
		d.stop()
		st, err := os.Stat(filepath.Join(dir, "store"))
		if err != nil {
			b.Fatal(err)
		}
		d2, startup := startNodeDaemon(b, bin, kubeconfig, dir)
		restarted := currentRSSKiB(b, d2.cmd.Process.Pid)
		d2.stop()
		b.ReportMetric(float64(current)/1024, "RSS-MiB")
		b.ReportMetric(float64(rss)/1024, "peak-RSS-MiB")
		b.ReportMetric(float64(restarted)/1024, "restart-RSS-MiB")
		b.ReportMetric(float64(st.Size())/(1<<20), "store-MiB")
		b.ReportMetric(startup.Seconds()*1000, "startup-ms")
	})
}
