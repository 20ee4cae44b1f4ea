package ipamnode_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/test/harness"
)

const node = "worker-1"

type daemon struct {
	socket string
	conn   *grpc.ClientConn
	ipam   nodev1.IPAMServiceClient
	info   infov1.NodeInfoServiceClient
	stop   func() error
}

// startDaemon runs ipam-node in-process over a store and socket in dir.
func startDaemon(t *testing.T, cfg *rest.Config, dir string, mod func(*ipamnode.Options)) *daemon {
	t.Helper()
	return startDaemonLogged(t, cfg, dir, mod, nil)
}

// startDaemonLogged is startDaemon with the daemon's log lines passed to logf.
func startDaemonLogged(t *testing.T, cfg *rest.Config, dir string, mod func(*ipamnode.Options), logf func(string)) *daemon {
	t.Helper()
	o := ipamnode.NewOptions()
	o.NodeName = node
	o.RestConfig = cfg
	o.PoolsNamespace = "default"
	o.StoreFile = filepath.Join(dir, "store")
	o.BindAddress = "unix://" + filepath.Join(dir, "daemon.sock")
	o.MetricsBindAddress, o.HealthProbeBindAddress = "0", "0"
	o.CNI.SkipBinaryCopy, o.CNI.SkipConfig = true, true
	if mod != nil {
		mod(o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	switch {
	case logf != nil:
		ctx = logr.NewContext(ctx, funcr.New(func(prefix, args string) { logf(prefix + " " + args) }, funcr.Options{}))
	case os.Getenv("HWIPAM_TEST_LOG") != "":
		ctx = logr.NewContext(ctx, funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: 2}))
	}
	done := make(chan error, 1)
	go func() { done <- ipamnode.Run(ctx, o) }()
	d := &daemon{}
	target := strings.TrimPrefix(o.BindAddress, "tcp://")
	if strings.HasPrefix(o.BindAddress, "unix://") {
		d.socket = strings.TrimPrefix(o.BindAddress, "unix://")
		target = "unix://" + d.socket
	}
	stopped := false
	d.stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		if d.conn != nil {
			d.conn.Close()
		}
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("daemon did not stop within 30s")
		}
	}
	t.Cleanup(func() {
		if err := d.stop(); err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
	waitFor(t, "the listener", func() bool {
		if d.socket != "" {
			_, err := os.Stat(d.socket)
			return err == nil
		}
		c, err := net.Dial("tcp", target)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	d.conn, d.ipam, d.info = conn, nodev1.NewIPAMServiceClient(conn), infov1.NewNodeInfoServiceClient(conn)
	return d
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func params(cid string, pools ...string) *nodev1.IPAMParameters {
	return &nodev1.IPAMParameters{Pools: pools, CniContainerid: cid, CniIfname: "net1",
		Metadata: &nodev1.IPAMMetadata{K8SPodName: "pod-" + cid, K8SPodNamespace: "default", K8SPodUid: "uid-" + cid}}
}

// poolWithBlock creates an IPPool and writes its status as the controller would.
func poolWithBlock(t *testing.T, c client.Client, name, subnet, start, end string) {
	t.Helper()
	p := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.IPPoolSpec{Subnet: subnet, PerNodeBlockSize: 4, DefaultGateway: false}}
	if err := c.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	p.Status.Allocations = []v1alpha1.Allocation{{NodeName: node, StartIP: start, EndIP: end}}
	if err := c.Status().Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
}

func code(err error) codes.Code { return status.Code(err) }

func TestDaemonServesSyncsAndSurvivesAPIOutage(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	if err := c.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	poolWithBlock(t, c, "rail0", "10.5.0.0/24", "10.5.0.1", "10.5.0.4")
	dir := t.TempDir()
	d := startDaemon(t, cp.Config, dir, nil)
	ctx := t.Context()

	for _, sock := range []string{d.socket, ipamwire.FastSocketPath(d.socket)} {
		fi, err := os.Stat(sock)
		if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
			t.Errorf("%s: mode = %v %v, want a socket with mode 0600", sock, fi.Mode(), err)
		}
	}
	var err error
	var first *nodev1.AllocateResponse
	waitFor(t, "the pool to sync", func() bool {
		first, err = d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c1", "rail0")})
		return err == nil
	})
	if a := first.Allocations[0]; a.Ip != "10.5.0.1/24" || a.Pool != "rail0" || a.PoolType != nodev1.PoolType_POOL_TYPE_IPPOOL {
		t.Errorf("first allocation = %+v", a)
	}
	again, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c1", "rail0")})
	if err != nil || again.Allocations[0].Ip != "10.5.0.1/24" {
		t.Errorf("repeated Allocate = %v %v, want the same address (idempotent)", again, err)
	}
	if _, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("c1", "rail0")}); err != nil {
		t.Errorf("IsAllocated: %v", err)
	}
	if _, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c2", "nope")}); code(err) != codes.NotFound {
		t.Errorf("unknown pool: %v, want NotFound", err)
	}
	bad := params("c3", "rail0")
	bad.CniIfname = ""
	if _, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: bad}); code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "cni_ifname") {
		t.Errorf("missing ifname: %v, want InvalidArgument naming cni_ifname", err)
	}
	for _, cid := range []string{"c4", "c5", "c6"} {
		if _, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params(cid, "rail0")}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c7", "rail0")})
	if code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "10.5.0.1-10.5.0.4") {
		t.Errorf("full block: %v, want ResourceExhausted naming the block", err)
	}
	// The plugin's compact endpoint gives the same answer and code as gRPC.
	wc, err := ipamwire.Dial("unix://"+d.socket, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	if wc.Transport() != ipamwire.TransportFast {
		t.Errorf("the plugin's client uses %s, want the compact endpoint", wc.Transport())
	}
	_, err = wc.Allocate(ctx, &ipamwire.Params{Pools: []string{"rail0"}, ContainerID: "c7", IfName: "net1", PodName: "pod-c7", PodNamespace: "default"})
	if ipamwire.CodeOf(err) != ipamwire.ResourceExhausted || !strings.Contains(err.Error(), "10.5.0.1-10.5.0.4") {
		t.Errorf("full block over the compact endpoint: %v, want ResourceExhausted naming the block", err)
	}
	if err := wc.IsAllocated(ctx, &ipamwire.Params{Pools: []string{"rail0"}, ContainerID: "c1", IfName: "net1"}); err != nil {
		t.Errorf("IsAllocated over the compact endpoint: %v", err)
	}
	if _, err := d.ipam.Deallocate(ctx, &nodev1.DeallocateRequest{Parameters: params("c6", "rail0")}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ipam.Deallocate(ctx, &nodev1.DeallocateRequest{Parameters: params("never", "rail0")}); err != nil {
		t.Errorf("deallocating something unknown: %v", err)
	}
	pools, err := d.info.ListPools(ctx, &infov1.ListPoolsRequest{})
	if err != nil || len(pools.Pools) != 1 || pools.Pools[0].Allocated != 3 || pools.Pools[0].Free != "1" || !pools.Pools[0].Active {
		t.Errorf("ListPools = %v %v", pools, err)
	}

	// The node is annotated with the pools in use.
	waitFor(t, "the pools-in-use annotation", func() bool {
		var n corev1.Node
		return c.Get(ctx, client.ObjectKey{Name: node}, &n) == nil && n.Annotations[v1alpha1.PoolsInUseAnnotation] == "rail0"
	})

	// Restart with the API server unreachable: the stored block still serves.
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	down := &rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}
	d2 := startDaemon(t, down, dir, nil)
	got, err := d2.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c8", "rail0")})
	if err != nil || got.Allocations[0].Ip != "10.5.0.4/24" {
		t.Errorf("allocation with the API server down = %v %v, want 10.5.0.4/24 from the stored block", got, err)
	}
	if _, err := d2.ipam.Deallocate(ctx, &nodev1.DeallocateRequest{Parameters: params("c1", "rail0")}); err != nil {
		t.Errorf("release with the API server down: %v", err)
	}
	if _, err := d2.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("c4", "rail0")}); err != nil {
		t.Errorf("an allocation made before the restart is gone: %v", err)
	}
}

func TestBlockRemovedStopsNewAllocationsOnly(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	poolWithBlock(t, c, "p", "10.6.0.0/24", "10.6.0.1", "10.6.0.8")
	d := startDaemon(t, cp.Config, t.TempDir(), nil)
	ctx := t.Context()
	waitFor(t, "the pool to sync", func() bool {
		_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c1", "p")})
		return err == nil
	})
	var p v1alpha1.IPPool
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "p"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Status.Allocations = nil
	if err := c.Status().Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	probe := 0
	waitFor(t, "the pool to go inactive", func() bool {
		probe++ // a new interface each time: an existing allocation is returned even by an inactive pool
		_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params(fmt.Sprintf("probe%d", probe), "p")})
		return code(err) == codes.NotFound
	})
	if _, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("c1", "p")}); err != nil {
		t.Errorf("an existing allocation was dropped with the block: %v", err)
	}
	if _, err := d.ipam.Deallocate(ctx, &nodev1.DeallocateRequest{Parameters: params("c1", "p")}); err != nil {
		t.Errorf("releasing in an inactive pool: %v", err)
	}
}

func TestCleanupReleasesAllocationsOfDeletedPods(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	poolWithBlock(t, c, "p", "10.7.0.0/24", "10.7.0.1", "10.7.0.8")
	mkPod := func(name string) *corev1.Pod {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		return pod
	}
	live, doomed := mkPod("live"), mkPod("doomed")
	d := startDaemon(t, cp.Config, t.TempDir(), func(o *ipamnode.Options) {
		o.CleanupInterval, o.CleanupMisses = 200*time.Millisecond, 3
	})
	alloc := func(cid string, pod *corev1.Pod) {
		t.Helper()
		prm := params(cid, "p")
		if pod != nil {
			prm.Metadata = &nodev1.IPAMMetadata{K8SPodName: pod.Name, K8SPodNamespace: "default", K8SPodUid: string(pod.UID)}
		} else {
			prm.Metadata = &nodev1.IPAMMetadata{K8SPodName: "unknown-origin", K8SPodNamespace: "default"}
		}
		waitFor(t, "allocation "+cid, func() bool {
			_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: prm})
			return err == nil
		})
	}
	alloc("live", live)
	alloc("doomed", doomed)
	if err := c.Delete(ctx, doomed); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted pod's allocation to be released", func() bool {
		_, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("doomed", "p")})
		return code(err) == codes.NotFound
	})
	if _, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("live", "p")}); err != nil {
		t.Errorf("a live pod's allocation was released: %v", err)
	}
	// A pod re-created under the same name gets a new UID: the old allocation goes.
	if err := c.Delete(ctx, live); err != nil {
		t.Fatal(err)
	}
	mkPod("live")
	waitFor(t, "the replaced pod's allocation to be released", func() bool {
		_, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params("live", "p")})
		return code(err) == codes.NotFound
	})
}

func freePortFor(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
