package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/test/harness"
)

// The rail path with every real part: the ipam-node binary reads a real captured
// sysfs tree (the ConnectX-3 InfiniBand machine) and labels its Node, a rail map
// naming the HCA by PCI address; the ipam-controller binary gives the pool that
// selects that rail a block on that node only; the nv-ipam plugin, run by macvlan
// in a network namespace, gets an address from it. SIGHUP rescans and does not
// end the daemon.
func TestRailFromCapturedSysfs(t *testing.T) {
	harness.RequireRoot(t)
	refBin := harness.CNIBinDir(t)
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c, ctx := cp.Client, t.Context()
	for _, n := range []string{nodeName, "cpu-only"} {
		if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	root, err := fakesysfs.Extract(filepath.Join(harness.RepoRoot(), "nicdiscovery", "testdata", "sysfs",
		"hwloc-32em64t-2n8c-cx3-ib.tar.bz2"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	rails := filepath.Join(state, "rails.yaml")
	if err := os.WriteFile(rails, []byte("ib-fabric: [\"0000:82:00.0\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	start(t, harness.BuildBinary(t, "./cmd/ipam-controller"), "--kubeconfig", kubeconfig, "--ippools-namespace", "default",
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	w := &world{binDir: t.TempDir(), confDir: t.TempDir(), socket: filepath.Join(state, "daemon.sock")}
	copyExec(t, filepath.Join(refBin, "macvlan"), filepath.Join(w.binDir, "macvlan"))
	daemon := start(t, harness.BuildBinary(t, "./cmd/ipam-node"), "--node-name", nodeName, "--kubeconfig", kubeconfig,
		"--ippools-namespace", "default", "--store-file", filepath.Join(state, "store"), "--bind-address", "unix://"+w.socket,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--cleanup-interval", "0",
		"--cni-bin-dir", w.binDir, "--cni-nv-ipam-bin-file", harness.BuildBinary(t, "./cmd/nv-ipam"),
		"--cni-conf-dir", w.confDir, "--cni-daemon-socket", "unix://"+w.socket,
		"--sysfs-root", root, "--rail-config", rails, "--nic-rescan-interval", "1h")

	eventually(t, "the NIC labels", func() bool {
		var n corev1.Node
		return c.Get(ctx, client.ObjectKey{Name: nodeName}, &n) == nil && n.Labels["nic.hwipam.io/ib0"] == "ib" &&
			n.Labels["nic.hwipam.io/rail.ib-fabric"] == "ib0" && n.Labels["nic.hwipam.io/ib0.speed"] == "56000"
	})
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "ib-fabric", Namespace: "default"},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.60.0.0/24", PerNodeBlockSize: 16, NodeSelector: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "nic.hwipam.io/rail.ib-fabric", Operator: corev1.NodeSelectorOpExists}}}}}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pool's block on the labelled node only", func() bool {
		var p v1alpha1.IPPool
		if c.Get(ctx, client.ObjectKeyFromObject(pool), &p) != nil {
			return false
		}
		return len(p.Status.Allocations) == 1 && p.Status.Allocations[0].NodeName == nodeName
	})

	// SIGHUP: a rescan, and the daemon keeps serving.
	if err := daemon.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := daemon.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("ipam-node is gone after SIGHUP: %v", err)
	}

	w.waitReady(t, "ib-fabric")
	node, pod := harness.NewNetNS(t), harness.NewNetNS(t)
	harness.NewVethPair(t, node, "ib0", harness.NewNetNS(t), "peer0") // stands in for the IPoIB port
	conf := []byte(fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "ib-fabric", "type": "macvlan", "master": "ib0",
		"ipam": {"type": "nv-ipam", "confDir": %q}}`, w.confDir))
	out, err := harness.CNICall{Plugin: filepath.Join(w.binDir, "macvlan"), Command: "ADD", ContainerID: "ctr-rail", NetNS: pod.Path,
		IfName: "net1", Args: podArgs("trainer-0"), Path: []string{w.binDir}, Config: conf, RunIn: node}.Run()
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	a := addrOf(t, out)
	if p := netip.MustParsePrefix(a); !netip.MustParsePrefix("10.60.0.0/24").Contains(p.Addr()) {
		t.Fatalf("address %s is not from the rail pool", a)
	}
	if got := pod.Addrs(t, "net1", netlink.FAMILY_V4); !slices.Equal(got, []string{a}) {
		t.Fatalf("net1 in the pod has %v, want %s", got, a)
	}
}
