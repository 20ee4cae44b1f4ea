// Package bench holds the benchmarks that run the project's real processes against
// the real control plane. `make bench` runs them; each reports its figures with
// b.ReportMetric.
package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
)

// BenchmarkController measures the ipam-controller binary against the real
// apiserver: N nodes exist, P pools selecting all of them are created at once, and
// the clock runs until every pool's status lists all N nodes. Reported: seconds to
// assign, status writes, the controller's peak RSS, and the size of the largest
// pool object (JSON, as stored) with its bytes per node.
func BenchmarkController(b *testing.B) {
	bin := harness.BuildBinary(b, "./cmd/ipam-controller")
	for _, nodes := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			cp := harness.StartControlPlane(b, harness.ControlPlaneOptions{})
			kubeconfig, err := cp.WriteKubeconfig(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			createNodes(b, cp.Client, nodes)
			for _, pools := range []int{1, 8} {
				b.Run(fmt.Sprintf("pools=%d", pools), func(b *testing.B) {
					for range b.N {
						runControllerOnce(b, cp, bin, kubeconfig, nodes, pools)
					}
				})
			}
		})
	}
}

func createNodes(b *testing.B, c client.Client, n int) {
	b.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-node-%05d", i),
					Labels: map[string]string{"nic.hwipam.io/present": "true"}}}
				if err := c.Create(context.Background(), node); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("creating nodes: %v", err)
	}
	b.Logf("created %d nodes in %s", n, time.Since(start).Round(time.Millisecond))
}

func runControllerOnce(b *testing.B, cp *harness.ControlPlane, bin, kubeconfig string, nodes, pools int) {
	b.Helper()
	ctx := context.Background()
	ns := fmt.Sprintf("bench-%d-%d", pools, time.Now().UnixNano())
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	metricsPort, healthPort := freePort(b), freePort(b)
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--ippools-namespace", ns, "--release-grace-period", "0",
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", metricsPort),
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", healthPort))
	if testing.Verbose() {
		cmd.Stderr = os.Stderr // the controller's log
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}()
	waitHTTP(b, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort))

	b.ResetTimer()
	start := time.Now()
	for p := range pools {
		pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rail%d", p), Namespace: ns},
			Spec: v1alpha1.IPPoolSpec{Subnet: fmt.Sprintf("10.%d.0.0/16", p), PerNodeBlockSize: 8}}
		if err := cp.Client.Create(ctx, pool); err != nil {
			b.Fatal(err)
		}
	}
	done := map[string]bool{}
	deadline := time.Now().Add(10 * time.Minute)
	for len(done) < pools {
		if time.Now().After(deadline) {
			b.Fatalf("after 10 minutes only %d of %d pools list all %d nodes", len(done), pools, nodes)
		}
		for p := range pools {
			name := fmt.Sprintf("rail%d", p)
			if done[name] {
				continue
			}
			var got v1alpha1.IPPool
			if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &got); err != nil {
				b.Fatal(err)
			}
			if len(got.Status.Allocations) == nodes {
				done[name] = true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()

	largest := 0
	for p := range pools {
		raw, err := cp.Clientset.CoreV1().RESTClient().Get().AbsPath("/apis/nv-ipam.nvidia.com/v1alpha1/namespaces", ns,
			"ippools", fmt.Sprintf("rail%d", p)).DoRaw(ctx)
		if err != nil {
			b.Fatal(err)
		}
		largest = max(largest, len(raw))
	}
	writes := scrapeCounter(b, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort), `hwipam_pool_status_writes_total{kind="IPPool"}`)
	rss := peakRSSKiB(b, cmd.Process.Pid)
	b.ReportMetric(elapsed.Seconds(), "s-to-assigned")
	b.ReportMetric(writes, "status-writes")
	b.ReportMetric(float64(rss)/1024, "peak-RSS-MiB")
	b.ReportMetric(float64(largest), "largest-pool-bytes")
	perNode := float64(largest) / float64(nodes)
	b.ReportMetric(perNode, "pool-bytes/node")
	// etcd's default request limit (--max-request-bytes) is 1.5 MiB; a pool object
	// grows linearly with its nodes.
	b.ReportMetric(1.5*1024*1024/perNode, "nodes-at-1.5MiB")
}

func freePort(b *testing.B) int {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitHTTP(b *testing.B, url string) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatalf("%s not OK within 2 minutes", url)
}

func scrapeCounter(b *testing.B, url, series string) float64 {
	b.Helper()
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			return f
		}
	}
	b.Fatalf("metric %s not found at %s", series, url)
	return 0
}

// peakRSSKiB reads VmHWM, the peak resident set size, of a running process.
func peakRSSKiB(b *testing.B, pid int) int { return procStatusKiB(b, pid, "VmHWM") }

// currentRSSKiB reads VmRSS of a running process.
func currentRSSKiB(b *testing.B, pid int) int { return procStatusKiB(b, pid, "VmRSS") }

// procStatusKiB reads a "<field>: N kB" line of /proc/<pid>/status.
func procStatusKiB(b *testing.B, pid int, field string) int {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kib, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				b.Fatal(err)
			}
			return kib
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func grpcCode(err error) string { return status.Code(err).String() }
