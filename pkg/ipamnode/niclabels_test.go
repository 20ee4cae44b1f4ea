package ipamnode_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/ipamcontroller"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/test/harness"
)

// foreignNIC is a label under our prefix that an admin set; the daemon leaves it.
const foreignNIC = "nic.hwipam.io/site-note"

// expectedLabels is what nicdiscovery derives from the tree, computed independently
// of the daemon.
func expectedLabels(t *testing.T, root string) map[string]string {
	t.Helper()
	inv, err := nicdiscovery.Scan(t.Context(), nicdiscovery.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	labels, _ := nicdiscovery.Labels(inv, nil)
	return labels
}

func nicLabels(t *testing.T, c client.Client, name string) (map[string]string, *corev1.Node) {
	t.Helper()
	var n corev1.Node
	if err := c.Get(t.Context(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range n.Labels {
		if strings.HasPrefix(k, nicdiscovery.LabelPrefix) && k != foreignNIC {
			out[k] = v
		}
	}
	return out, &n
}

// The daemon's labels appear on its Node, follow a NIC taken out of the tree, are
// written only when they change (not on every rescan, not after a restart), and
// leave every other label alone.
func TestNICLabelsFollowTheHardware(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	// Foreign labels, one of them under our prefix (set by an admin): never ours.
	foreign := map[string]string{"team": "ml", "kubernetes.io/hostname": node, "feature.node.kubernetes.io/pci-15b3.present": "true",
		foreignNIC: "keep-me"}
	if err := c.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: foreign}}); err != nil {
		t.Fatal(err)
	}
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	want := expectedLabels(t, tree.Root)
	if want["nic.hwipam.io/ibp24s0"] != "ib" || len(want) < 40 {
		t.Fatalf("unexpected label set from the tree: %v", want)
	}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePortFor(t))
	opts := func(o *ipamnode.Options) {
		o.SysfsRoot = tree.Root
		o.NICRescanInterval = 100 * time.Millisecond
		o.MetricsBindAddress = metricsAddr
	}
	writes := func() string { return metric(t, metricsAddr, "hwipam_node_nic_label_writes_total") }
	scans := func() int {
		n, _ := strconv.Atoi(metric(t, metricsAddr, "hwipam_node_nic_scans_total"))
		return n
	}
	d := startDaemon(t, cp.Config, t.TempDir(), opts)
	checkForeign := func(n *corev1.Node) {
		t.Helper()
		for k, v := range foreign {
			if n.Labels[k] != v {
				t.Errorf("foreign label %s=%q changed to %q", k, v, n.Labels[k])
			}
		}
	}
	waitFor(t, "the NIC labels on the Node", func() bool {
		got, _ := nicLabels(t, c, node)
		return maps.Equal(got, want)
	})
	_, n := nicLabels(t, c, node)
	checkForeign(n)
	rv, w := n.ResourceVersion, writes()
	time.Sleep(800 * time.Millisecond) // several rescans and a read-back, nothing changed
	if _, n := nicLabels(t, c, node); n.ResourceVersion != rv || writes() != w {
		t.Fatalf("the labels were applied again although the NIC set did not change (Node %s -> %s, writes %s -> %s)",
			rv, n.ResourceVersion, w, writes())
	}

	// Someone removes and changes labels the daemon owns: they are put back within
	// ten scans; a foreign label added meanwhile stays.
	var edit corev1.Node
	if err := c.Get(t.Context(), client.ObjectKey{Name: node}, &edit); err != nil {
		t.Fatal(err)
	}
	delete(edit.Labels, "nic.hwipam.io/ibp94s0")
	edit.Labels["nic.hwipam.io/ibp154s0.numa"] = "7"
	edit.Labels["rack"] = "r12"
	if err := c.Update(t.Context(), &edit); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the labels to be restored", func() bool {
		got, _ := nicLabels(t, c, node)
		return maps.Equal(got, want)
	})
	_, n = nicLabels(t, c, node)
	if n.Labels["rack"] != "r12" {
		t.Fatalf("a foreign label was removed: %v", n.Labels)
	}
	foreign["rack"] = "r12"
	rv, w = n.ResourceVersion, writes()

	// A port loses its link: the kernel then reports the lowest rate and a DOWN
	// state; the labels (and so the pools the node is in) stay as they are.
	port := filepath.Join(tree.Root, "sys", "bus", "pci", "devices", "0000:40:00.0", "infiniband", "mlx5_1", "ports", "1")
	writeFile(t, filepath.Join(port, "state"), "1: DOWN\n")
	writeFile(t, filepath.Join(port, "rate"), "10 Gb/sec (4X SDR)\n")
	if l := expectedLabels(t, tree.Root); l["nic.hwipam.io/ibp64s0.speed"] != "" {
		t.Fatalf("a down port has a speed in the inventory: %v", l)
	}
	time.Sleep(600 * time.Millisecond)
	if got, n := nicLabels(t, c, node); !maps.Equal(got, want) || n.ResourceVersion != rv || writes() != w {
		t.Fatalf("a link going down changed the labels: %v", got)
	}

	// A restart finds its labels in place and does not write. (The counter is the
	// process's, so it carries over to the second daemon in this test.)
	w = writes()
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	_, n = nicLabels(t, c, node)
	rv = n.ResourceVersion
	startDaemon(t, cp.Config, t.TempDir(), opts)
	waitFor(t, "the restarted daemon's metrics", func() bool { return writes() != "" })
	s0 := scans()
	waitFor(t, "the restarted daemon's scans", func() bool { return scans() >= s0+8 })
	if _, n := nicLabels(t, c, node); n.ResourceVersion != rv || writes() != w {
		t.Fatalf("the restarted daemon applied unchanged labels (Node %s -> %s, writes %s -> %s)", rv, n.ResourceVersion, w, writes())
	}

	// A PF's netdev moves into a pod (host-device): the function is still there,
	// so its labels stay.
	moved := map[string]string{}
	for k, v := range want {
		if strings.HasPrefix(k, "nic.hwipam.io/ibp79s0") {
			moved[k] = v
		}
	}
	if err := tree.MoveNetdev("0000:4f:00.0", "ibp79s0"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	if got, n := nicLabels(t, c, node); !maps.Equal(got, want) || n.ResourceVersion != rv || writes() != w {
		t.Fatalf("a netdev moving into a pod changed the labels: %v", got)
	}
	// ... and its driver is reloaded meanwhile (unbound for a moment).
	if err := tree.Unbind("0000:4f:00.0"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	if got, n := nicLabels(t, c, node); !maps.Equal(got, want) || n.ResourceVersion != rv || writes() != w {
		t.Fatalf("an unbound driver changed the labels: %v", got)
	}

	// A rail NIC goes away: its five keys go, the count drops, the rest stays.
	if err := tree.Remove("0000:18:00.0"); err != nil {
		t.Fatal(err)
	}
	want = expectedLabels(t, tree.Root)
	if _, ok := want["nic.hwipam.io/ibp24s0"]; ok || want["nic.hwipam.io/count"] != "8" {
		t.Fatalf("label set after the removal: %v", want)
	}
	want["nic.hwipam.io/ibp64s0.speed"] = "400000" // still down: the last known speed stays
	maps.Copy(want, moved)                         // still in the pod
	want["nic.hwipam.io/count"] = "9"
	waitFor(t, "the removed NIC's labels to go", func() bool {
		got, _ := nicLabels(t, c, node)
		return maps.Equal(got, want)
	})
	_, n = nicLabels(t, c, node)
	checkForeign(n)
	for k := range n.Labels {
		if strings.HasPrefix(k, "nic.hwipam.io/ibp24s0") {
			t.Errorf("label %s of the removed NIC is still there", k)
		}
	}
}

// Two nodes with different hardware, each with its daemon, and the controller: a
// pool whose nodeSelector names a NIC gets a block on exactly the node that has
// it, and that node's daemon allocates from it.
func TestPoolFollowsRail(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	dgx, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sriov, err := fakesysfs.SRIOV(t.TempDir(), 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	trees := map[string]string{"gpu-a": dgx.Root, "cpu-b": sriov.Root}
	daemons := map[string]*daemon{}
	for name, root := range trees {
		if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatal(err)
		}
		daemons[name] = startDaemon(t, cp.Config, t.TempDir(), func(o *ipamnode.Options) {
			o.NodeName = name
			o.SysfsRoot = root
			o.NICRescanInterval = 200 * time.Millisecond
		})
	}
	for name, root := range trees {
		want := expectedLabels(t, root)
		waitFor(t, "the labels of "+name, func() bool {
			got, _ := nicLabels(t, c, name)
			return maps.Equal(got, want)
		})
	}

	co := ipamcontroller.NewOptions()
	co.RestConfig, co.PoolsNamespace = cp.Config, "default"
	co.MetricsBindAddress, co.HealthProbeBindAddress = "0", "0"
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ipamcontroller.Run(runCtx, co) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})

	selector := func(key, value string) *corev1.NodeSelector {
		return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{value}}}}}}
	}
	pools := map[string]*corev1.NodeSelector{
		"rail-ib0":  selector("nic.hwipam.io/ibp24s0", "ib"),
		"sriov-eth": selector("nic.hwipam.io/ens1f0np0", "eth"),
		"ndr":       selector("nic.hwipam.io/ibp220s0.speed", "400000"),
		"nowhere":   selector("nic.hwipam.io/ibp24s0", "eth"),
	}
	wantNodes := map[string][]string{"rail-ib0": {"gpu-a"}, "sriov-eth": {"cpu-b"}, "ndr": {"gpu-a"}, "nowhere": nil}
	i := 0
	for name, sel := range pools {
		i++
		p := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: v1alpha1.IPPoolSpec{Subnet: fmt.Sprintf("10.%d.0.0/24", 30+i), PerNodeBlockSize: 16, NodeSelector: sel}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range wantNodes {
		waitFor(t, "the blocks of pool "+name, func() bool {
			var p v1alpha1.IPPool
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &p); err != nil {
				return false
			}
			if p.Status.ObservedGeneration != p.Generation {
				return false
			}
			var got []string
			for _, a := range p.Status.Allocations {
				got = append(got, a.NodeName)
			}
			return fmt.Sprint(got) == fmt.Sprint(want)
		})
	}
	waitFor(t, "an allocation from the rail pool on gpu-a", func() bool {
		_, err := daemons["gpu-a"].ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c1", "rail-ib0")})
		return err == nil
	})
	if _, err := daemons["cpu-b"].ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c2", "rail-ib0")}); err == nil {
		t.Fatal("cpu-b allocated from a pool for a NIC it does not have")
	}
}

// --nic-labels=nodefeature writes an NFD NodeFeature with the labels in spec and
// leaves the Node's labels alone; the rail map adds rail labels.
func TestNICLabelsAsNodeFeature(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{CRDDirs: []string{
		filepath.Join(harness.RepoRoot(), "deploy", "crds"), filepath.Join("testdata", "nfd")}})
	c := cp.Client
	if err := c.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	tree, err := fakesysfs.VPI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rails := filepath.Join(t.TempDir(), "rails.yaml")
	writeFile(t, rails, "fabric: [\"0000:04:00.0\"]\nmgmt: [ens1d1]\n")
	d := startDaemon(t, cp.Config, t.TempDir(), func(o *ipamnode.Options) {
		o.SysfsRoot = tree.Root
		o.NICLabels = ipamnode.NICLabelsNodeFeature
		o.NodeFeatureNamespace = "default"
		o.RailConfig = rails
	})
	want := expectedLabels(t, tree.Root)
	want["nic.hwipam.io/rail.fabric"] = "ib0"
	want["nic.hwipam.io/rail.mgmt"] = "ens1d1"
	nf := &unstructured.Unstructured{}
	nf.SetGroupVersionKind(ipamnode.NodeFeatureGVK)
	waitFor(t, "the NodeFeature", func() bool {
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "hwipam-" + node}, nf); err != nil {
			return false
		}
		got, _, _ := unstructured.NestedStringMap(nf.Object, "spec", "labels")
		return maps.Equal(got, want)
	})
	if nf.GetLabels()["nfd.node.kubernetes.io/node-name"] != node {
		t.Errorf("NodeFeature labels %v lack the node name", nf.GetLabels())
	}
	if got, _ := nicLabels(t, c, node); len(got) != 0 {
		t.Errorf("nodefeature mode labelled the Node: %v", got)
	}
	// ipamctl learns the daemon's view: its tree, its rail map (content too), its
	// label mode, and the ports it labels.
	info, err := d.info.GetInfo(t.Context(), &infov1.GetInfoRequest{})
	if err != nil || info.GetSysfsRoot() != tree.Root || info.GetRailConfig() != rails || info.GetNicLabels() != "nodefeature" ||
		info.GetRailConfigContent() != "fabric: [\"0000:04:00.0\"]\nmgmt: [ens1d1]\n" {
		t.Errorf("GetInfo: %v, %v", info, err)
	}
	wantPorts(t, d, "ib0 0000:04:00.0/1 InfiniBand [fabric]", "ens1d1 0000:04:00.0/2 Ethernet [mgmt]")

	// SIGHUP rescans at once (the interval is a minute here) and does not end the
	// process.
	if err := tree.Remove("0000:04:00.0"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the NodeFeature to go after SIGHUP", func() bool {
		err := c.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "hwipam-" + node}, nf)
		return apierrors.IsNotFound(err)
	})
}

// A wrong --node-name: the daemon says so once and never creates a Node.
func TestNICLabelsNeverCreateANode(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	tree, err := fakesysfs.VPI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	warnings := 0
	d := startDaemonLogged(t, cp.Config, t.TempDir(), func(o *ipamnode.Options) {
		o.NodeName = "no-such-node"
		o.SysfsRoot = tree.Root
		o.NICRescanInterval = 100 * time.Millisecond
	}, func(line string) {
		if strings.Contains(line, "cannot publish the NIC labels: this node does not exist in the API; check --node-name") {
			mu.Lock()
			warnings++
			mu.Unlock()
		}
	})
	waitFor(t, "the warning", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return warnings > 0
	})
	time.Sleep(500 * time.Millisecond)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	var nodes corev1.NodeList
	if err := cp.Client.List(t.Context(), &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 0 || warnings != 1 {
		t.Fatalf("%d nodes (want none) and %d warnings (want one)", len(nodes.Items), warnings)
	}

	// A node without NVIDIA NICs: nothing to publish, and nothing is written, also
	// not when the labels are read back.
	if err := cp.Client.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	empty, err := fakesysfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePortFor(t))
	startDaemon(t, cp.Config, t.TempDir(), func(o *ipamnode.Options) {
		o.SysfsRoot = empty.Root
		o.NICRescanInterval = 50 * time.Millisecond
		o.MetricsBindAddress = metricsAddr
	})
	waitFor(t, "the metrics", func() bool { return metric(t, metricsAddr, "hwipam_node_nic_scans_total") != "" })
	s0, _ := strconv.Atoi(metric(t, metricsAddr, "hwipam_node_nic_scans_total"))
	w0 := metric(t, metricsAddr, "hwipam_node_nic_label_writes_total")
	waitFor(t, "twenty scans", func() bool {
		s, _ := strconv.Atoi(metric(t, metricsAddr, "hwipam_node_nic_scans_total"))
		return s >= s0+20
	})
	if w := metric(t, metricsAddr, "hwipam_node_nic_label_writes_total"); w != w0 {
		t.Fatalf("a node without NICs had its labels written %s -> %s times", w0, w)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// metric reads one unlabelled metric's value from a metrics endpoint, "" when the
// endpoint or the metric is not there.
func metric(t *testing.T, addr, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// wantPorts fails unless the daemon's ListNICs answers exactly these ports, each
// "name pci/port linkLayer [rails]".
func wantPorts(t *testing.T, d *daemon, want ...string) {
	t.Helper()
	resp, err := d.info.ListNICs(t.Context(), &infov1.ListNICsRequest{})
	if err != nil || resp.GetError() != "" {
		t.Fatalf("ListNICs: %v %v", resp, err)
	}
	var got []string
	for _, p := range resp.GetPorts() {
		got = append(got, fmt.Sprintf("%s %s/%d %s %v", p.GetName(), p.GetPciAddress(), p.GetPort(), p.GetLinkLayer(), p.GetRails()))
	}
	if !slices.Equal(got, want) {
		t.Errorf("ListNICs: ports %q, want %q", got, want)
	}
}
