package ipamctl_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/test/harness"
)

// check against the real ipam-node process: it labels its Node from a sysfs tree
// whose ConnectX PF is a veth (the rail), installs the real plugin and
// nv-ipam.conf, syncs its pool from the API server and hands out addresses over
// its socket. The gateway sits in a network namespace at the veth's other end.
// Healthy, check says nothing is wrong; then each fault, one at a time, is the
// one problem it reports.
func TestCheckWithTheRealDaemon(t *testing.T) {
	harness.RequireRoot(t)
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	ctx := t.Context()
	dir, binDir, confDir := nodeDirs(t)
	rail, tree, run := railWithGateway(t, "hwd", "10.76.0")

	// The cluster: node n1, the pod, and pool rail0 selecting the nodes the daemon
	// labels with the rail NIC, with n1's block.
	c := cp.Client
	sel := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "nic.hwipam.io/" + rail, Operator: corev1.NodeSelectorOpExists}}}}}
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: "pools"},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.76.0.0/24", PerNodeBlockSize: 16, Gateway: "10.76.0.1", NodeSelector: sel}}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pools"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "trainer-0", Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}},
		pool,
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	pool.Status.Allocations = []v1alpha1.Allocation{{NodeName: "n1", StartIP: "10.76.0.16", EndIP: "10.76.0.31"}}
	if err := c.Status().Update(ctx, pool); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}

	// The daemon, as the DaemonSet runs it, its paths in dir.
	sockPath := filepath.Join(dir, "daemon.sock")
	sock := "unix://" + sockPath
	daemon := exec.Command(harness.BuildBinary(t, "./cmd/ipam-node"), "--node-name", "n1", "--kubeconfig", kubeconfig,
		"--ippools-namespace", "pools", "--store-file", filepath.Join(dir, "store"), "--bind-address", sock,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--cleanup-interval", "0",
		"--sysfs-root", tree.Root, "--nic-rescan-interval", "1h",
		"--cni-bin-dir", binDir, "--cni-nv-ipam-bin-file", harness.BuildBinary(t, "./cmd/nv-ipam"),
		"--cni-conf-dir", confDir, "--cni-daemon-socket", sock, "--cni-log-file", filepath.Join(dir, "cni.log"))
	var daemonLog strings.Builder
	daemon.Stdout, daemon.Stderr = &daemonLog, &daemonLog
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = daemon.Process.Kill()
			_ = daemon.Wait()
		}
	})
	conn, err := grpc.NewClient(sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info := infov1.NewNodeInfoServiceClient(conn)
	// waitPool waits until the daemon serves rail0 with gateway gw.
	waitPool := func(gw string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			resp, err := info.ListPools(ctx, &infov1.ListPoolsRequest{})
			for _, p := range resp.GetPools() {
				if err == nil && p.GetKey() == "rail0" && p.GetActive() && p.GetGateway() == gw {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the daemon does not serve rail0 with gateway %s: %v %v\n%s", gw, err, resp, daemonLog.String())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitPool("10.76.0.1")
	deadline := time.Now().Add(60 * time.Second)
	for node := (&corev1.Node{}); ; time.Sleep(200 * time.Millisecond) {
		if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, node); err == nil && node.Labels["nic.hwipam.io/"+rail] != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not label n1 with its rail NIC: %v\n%s", node.Labels, daemonLog.String())
		}
	}
	ipam := nodev1.NewIPAMServiceClient(conn)
	params := func(pod, cid, ifName string) *nodev1.IPAMParameters {
		return &nodev1.IPAMParameters{Pools: []string{"rail0"}, PoolType: nodev1.PoolType_POOL_TYPE_IPPOOL, CniContainerid: cid,
			CniIfname: ifName, Metadata: &nodev1.IPAMMetadata{K8SPodName: pod, K8SPodNamespace: "default"}}
	}
	alloc := func(pod, cid, ifName string) {
		t.Helper()
		if _, err := ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params(pod, cid, ifName)}); err != nil {
			t.Fatal(err)
		}
	}
	dealloc := func(pod, cid, ifName string) {
		t.Helper()
		if _, err := ipam.Deallocate(ctx, &nodev1.DeallocateRequest{Parameters: params(pod, cid, ifName)}); err != nil {
			t.Fatal(err)
		}
	}
	alloc("trainer-0", "c0", "net1")

	args := []string{"--socket", sock, "--kubeconfig", kubeconfig, "--sysfs-root", tree.Root, "--probe"}
	r, code := checkRun(t, args...)
	wantOnly(t, "healthy", r, code)
	for _, want := range []string{"ipam-node ", "readable and consistent, 1 allocation", "the one this daemon installed",
		"the plugin calls " + sock, "block 10.76.0.16-10.76.0.31, 1 used", "rail NIC " + rail + " (0000:3b:00.0) is up",
		"gateway 10.76.0.1 answers on " + rail, "every allocation's pod exists"} {
		if !strings.Contains(fmt.Sprint(r.Findings), want) {
			t.Errorf("healthy report lacks %q: %+v", want, r.Findings)
		}
	}
	if r.Node != "n1" {
		t.Errorf("node %q, want the daemon's n1", r.Node)
	}

	// The store: a copy taken now lacks the next allocation.
	b, err := os.ReadFile(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "store.copy"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	alloc("trainer-0", "c0", "net2")
	r, code = checkRun(t, append(args, "--store-file", filepath.Join(dir, "store.copy"))...)
	wantOnly(t, "store and daemon disagree", r, code, "the store and the daemon disagree on 1 allocation(s)")
	dealloc("trainer-0", "c0", "net2")

	linkDownAndPoolWithoutBlock(ctx, t, c, run, rail, "10.75.0.0/24", args)

	alloc("gone-0", "c1", "net1")
	r, code = checkRun(t, args...)
	wantOnly(t, "stale allocation", r, code, "held by pod default/gone-0, which no longer exists")
	dealloc("gone-0", "c1", "net1")

	plugin := filepath.Join(binDir, "nv-ipam")
	if err := os.Rename(plugin, plugin+".away"); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "missing plugin", r, code, "the nv-ipam plugin is not installed")
	if err := os.Rename(plugin+".away", plugin); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(confDir, "nv-ipam.conf")
	if err := os.Rename(conf, conf+".away"); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "missing nv-ipam.conf", r, code, "nv-ipam.conf is missing")
	if err := os.Rename(conf+".away", conf); err != nil {
		t.Fatal(err)
	}
	// nv-ipam.conf edited by hand: still parsed and used, but not what the daemon wrote.
	written, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, bytes.Replace(written, []byte(`"logLevel": "info"`), []byte(`"logLevel": "debug"`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "edited nv-ipam.conf", r, code, "nv-ipam.conf is not the one this daemon wrote")
	if err := os.WriteFile(conf, written, 0o644); err != nil {
		t.Fatal(err)
	}

	// A gateway nobody holds: the pool's gateway moved to .2, which the daemon syncs.
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.Gateway = "10.76.0.2"
	if err := c.Update(ctx, pool); err != nil {
		t.Fatal(err)
	}
	waitPool("10.76.0.2")
	// Without --probe, nothing has resolved it yet: said, and left to --probe.
	r, code = checkRun(t, "--socket", sock, "--kubeconfig", kubeconfig, "--sysfs-root", tree.Root)
	wantOnly(t, "unresolved gateway without --probe", r, code)
	if !strings.Contains(fmt.Sprint(r.Findings), "gateway 10.76.0.2 is not in "+rail+"'s neighbour table yet") {
		t.Errorf("without --probe, the unresolved gateway is not reported as such: %+v", r.Findings)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "unreachable gateway", r, code, "gateway 10.76.0.2 does not answer on "+rail)

	// The daemon stopped: one error, the rest still checked, exit code 2.
	_ = daemon.Process.Signal(syscall.SIGTERM)
	_ = daemon.Wait()
	stopped = true
	r, code = checkRun(t, append(args, "--timeout", "1s", "--node-name", "n1", "--ippools-namespace", "pools",
		"--store-file", filepath.Join(dir, "store"), "--cni-bin-dir", binDir, "--cni-conf-dir", confDir)...)
	if got := problems(r); code != ipamctl.ExitUsage || len(got) == 0 || !strings.HasPrefix(got[0], "error daemon:") {
		t.Errorf("daemon stopped: exit %d, %q", code, got)
	}
}
