package ipamctl_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/test/harness"
)

// daemonNICs is the daemon's NIC inventory as a test sets it.
type daemonNICs struct {
	mu    sync.Mutex
	ports []*infov1.NICPort
}

func (d *daemonNICs) NICs(context.Context) *infov1.ListNICsResponse {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &infov1.ListNICsResponse{Ports: d.ports}
}

func (d *daemonNICs) set(ports ...*infov1.NICPort) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ports = ports
}

// findings are a report's messages.
func findings(r ipamctl.CheckReport) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, f.Message)
	}
	return out
}

// check with no --sysfs-root and no --rail-config sees the NICs as the daemon
// does: its sysfs tree (a captured one, as on the demo node) and its rail map,
// whose path does not exist where check runs (the daemon sends its content). A
// pool selecting the rail NIC by name and one selecting it by rail find it up,
// then down naming its link, then up again; where ipamctl's view and the
// daemon's inventory disagree, the finding says both; with no daemon, the
// report says the defaults stood.
func TestCheckTakesTheDaemonsView(t *testing.T) {
	harness.RequireRoot(t)
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	ctx := t.Context()
	dir, binDir, confDir := nodeDirs(t)
	pluginSum := installedPlugin(t, binDir)
	rail, tree, run := railWithGateway(t, "hwv", "10.79.0")

	// The daemon: its tree, its rail map (railA: the rail NIC), both pools' blocks.
	var pools []*nodealloc.PoolConfig
	for i, name := range []string{"byname", "byrail"} {
		start := netip.AddrFrom4([4]byte{10, 79, byte(i + 1), 16})
		pools = append(pools, &nodealloc.PoolConfig{Name: name, Kind: v1alpha1.KindIPPool,
			Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 79, byte(i + 1), 0}), 24),
			Block:  iprange.Range{Start: start, End: netip.AddrFrom4([4]byte{10, 79, byte(i + 1), 31})}, ExclusionBase: start})
	}
	nics := &daemonNICs{}
	inventory := &infov1.NICPort{Name: rail, PciAddress: "0000:3b:00.0", Port: 1, Netdev: rail, LinkLayer: "Ethernet", Rails: []string{"railA"}}
	nics.set(inventory)
	sock, _ := harness.ServeNodeWithNICs(t, dir, &infov1.GetInfoResponse{Version: "test", NodeName: "n1",
		StoreFile: filepath.Join(dir, "store"), CniBinDir: binDir, CniConfDir: confDir, PluginSha256: pluginSum,
		PoolsNamespace: "pools", SysfsRoot: tree.Root, RailConfig: "/etc/hwipam/not-here/rails.yaml",
		RailConfigContent: "railA: [" + rail + "]\n", NicLabels: "node"}, nics, pools...)
	if err := os.WriteFile(filepath.Join(confDir, "nv-ipam.conf"), fmt.Appendf(nil, `{"daemonSocket": %q}`, sock), 0o644); err != nil {
		t.Fatal(err)
	}

	// The cluster: the node with the labels the daemon publishes, the two pools.
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := cp.Client
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pools"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{
			"nic.hwipam.io/" + rail: "eth", "nic.hwipam.io/rail.railA": rail}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range []struct {
		name string
		req  corev1.NodeSelectorRequirement
	}{
		{"byname", corev1.NodeSelectorRequirement{Key: "nic.hwipam.io/" + rail, Operator: corev1.NodeSelectorOpIn, Values: []string{"eth"}}},
		{"byrail", corev1.NodeSelectorRequirement{Key: "nic.hwipam.io/rail.railA", Operator: corev1.NodeSelectorOpExists}},
	} {
		pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "pools"},
			Spec: v1alpha1.IPPoolSpec{Subnet: fmt.Sprintf("10.79.%d.0/24", i+1), PerNodeBlockSize: 16, NodeSelector: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{p.req}}}}}}
		if err := c.Create(ctx, pool); err != nil {
			t.Fatal(err)
		}
		pool.Status.Allocations = []v1alpha1.Allocation{{NodeName: "n1", StartIP: fmt.Sprintf("10.79.%d.16", i+1),
			EndIP: fmt.Sprintf("10.79.%d.31", i+1)}}
		if err := c.Status().Update(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}

	args := []string{"--socket", sock, "--kubeconfig", kubeconfig}
	byName := fmt.Sprintf("rail NIC %s (0000:3b:00.0)", rail)
	byRail := fmt.Sprintf("rail NIC rail.railA (%s, 0000:3b:00.0)", rail)
	healthy := func(step string) {
		t.Helper()
		r, code := checkRun(t, args...)
		wantOnly(t, step, r, code)
		got := findings(r)
		for _, want := range []string{byName + " is up", byRail + " is up"} {
			if !slices.Contains(got, want) {
				t.Errorf("%s: no finding %q in %q", step, want, got)
			}
		}
		if v := r.View; v == nil || v.SysfsRoot != tree.Root || v.SysfsRootFrom != ipamctl.FromDaemon ||
			v.RailConfigFrom != ipamctl.FromDaemon || v.NICLabels != "node" {
			t.Errorf("%s: view %+v; want the daemon's tree %s and rail map", step, v, tree.Root)
		}
	}
	healthy("healthy")

	run("ip", "link", "set", rail, "down")
	r, code := checkRun(t, args...)
	wantOnly(t, "rail link down", r, code, byName+" is down", byRail+" is down")
	run("ip", "link", "set", rail, "up")
	healthy("rail link up again")

	// ipamctl reads another tree (a flag) than the daemon: both views are named.
	empty, err := fakesysfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, append(args, "--sysfs-root", empty.Root)...)
	differ := fmt.Sprintf("is in the daemon's inventory (0000:3b:00.0, port 1, netdev %s), but not in ipamctl's scan of %s", rail, empty.Root)
	wantOnly(t, "another tree", r, code, "rail NIC "+rail+" "+differ, "rail NIC rail.railA "+differ)
	// The daemon's inventory lacks what ipamctl's scan has.
	nics.set()
	r, code = checkRun(t, args...)
	lacks := "is in ipamctl's scan of " + tree.Root + ", but not in the daemon's inventory"
	wantOnly(t, "not in the daemon's inventory", r, code, byName+" "+lacks, "rail NIC rail.railA (0000:3b:00.0) "+lacks)
	nics.set(inventory)

	// labels and nics take the same view.
	var out, errOut bytes.Buffer
	if err := ipamctl.Run(ctx, ipamctl.Options{Args: []string{"labels", "--socket", sock}, Stdout: &out, Stderr: &errOut}); err != nil ||
		!strings.Contains(out.String(), "nic.hwipam.io/rail.railA="+rail+"\n") || !strings.Contains(out.String(), "nic.hwipam.io/"+rail+"=eth\n") ||
		!strings.Contains(errOut.String(), "NICs read from "+tree.Root+" (the daemon's)") {
		t.Errorf("labels: %v\n%s%s", err, out.String(), errOut.String())
	}

	// No daemon: the defaults stand, and the report says so.
	r, _ = checkRun(t, "--socket", "unix://"+filepath.Join(dir, "none.sock"), "--timeout", "500ms", "--kubeconfig", kubeconfig,
		"--node-name", "n1", "--store-file", filepath.Join(dir, "store"), "--cni-bin-dir", binDir, "--cni-conf-dir", confDir)
	if v := r.View; v == nil || v.SysfsRoot != "/" || v.SysfsRootFrom != ipamctl.FromDefault || v.RailConfigFrom != ipamctl.FromDefault ||
		!strings.Contains(v.Note, "no daemon answered") || !slices.ContainsFunc(findings(r), func(s string) bool {
		return strings.HasPrefix(s, "NICs read from / (the default), no rail map; no daemon answered")
	}) {
		t.Errorf("no daemon: view %+v, findings %q", v, findings(r))
	}
}
