package ipamctl_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/test/harness"
)

// checkRun runs `ipamctl check -o json` and returns the report and the exit code.
func checkRun(t *testing.T, args ...string) (ipamctl.CheckReport, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := ipamctl.Run(t.Context(), ipamctl.Options{Args: append([]string{"check", "-o", "json"}, args...), Stdout: &out, Stderr: &errOut})
	var r ipamctl.CheckReport
	if jerr := json.Unmarshal(out.Bytes(), &r); jerr != nil {
		t.Fatalf("check -o json (%v): %v\n%s%s", err, jerr, out.String(), errOut.String())
	}
	return r, ipamctl.ExitCode(err)
}

// problems are the warnings and errors of a report, "severity check: message".
func problems(r ipamctl.CheckReport) []string {
	var out []string
	for _, f := range r.Findings {
		if f.Severity == ipamctl.SeverityWarning || f.Severity == ipamctl.SeverityError {
			out = append(out, f.Severity+" "+f.Check+": "+f.Message)
		}
	}
	return out
}

// wantOnly fails unless the report's problems are exactly one per want entry, each
// containing it.
func wantOnly(t *testing.T, step string, r ipamctl.CheckReport, code int, want ...string) {
	t.Helper()
	got := problems(r)
	wantCode := ipamctl.ExitOK
	if len(want) > 0 {
		wantCode = ipamctl.ExitProblems
	}
	ok := len(got) == len(want) && code == wantCode
	for i := 0; ok && i < len(want); i++ {
		ok = strings.Contains(got[i], want[i])
	}
	if !ok {
		t.Errorf("%s: exit %d, problems %q; want exit %d and problems %q", step, code, got, wantCode, want)
	}
}

// check finds each fault it exists for, on a node made of real parts: the node
// service over its socket, its store, the plugin and nv-ipam.conf on disk, a veth
// standing in for the rail NIC (a ConnectX PF of that name in a sysfs tree), the
// gateway in a network namespace at the veth's other end, and the real API server
// with the Node, the pools and the pods.
func TestCheckFindsEachFault(t *testing.T) {
	harness.RequireRoot(t)
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	ctx := t.Context()
	dir, binDir, confDir := nodeDirs(t)
	pluginSum := installedPlugin(t, binDir)

	// The rail: a veth whose peer, in the gateway's netns, holds the gateway.
	rail, tree, run := railWithGateway(t, "hwc", "10.77.0")

	// The daemon: pool rail0 (10.77.0.16-10.77.0.31, gateway .1) served from its block.
	start, end := netip.MustParseAddr("10.77.0.16"), netip.MustParseAddr("10.77.0.31")
	cfg := &nodealloc.PoolConfig{Name: "rail0", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.77.0.0/24"),
		Block: iprange.Range{Start: start, End: end}, ExclusionBase: start, Gateway: netip.MustParseAddr("10.77.0.1")}
	sock, m := harness.ServeNodeIn(t, dir, &infov1.GetInfoResponse{Version: "test", NodeName: "n1", StoreFile: filepath.Join(dir, "store"),
		CniBinDir: binDir, CniConfDir: confDir, PluginSha256: pluginSum, PoolsNamespace: "pools"}, cfg)
	conf := fmt.Sprintf(`{"daemonSocket": %q}`, sock)
	if err := os.WriteFile(filepath.Join(confDir, "nv-ipam.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	alloc := func(pod, cid string) {
		t.Helper()
		if _, err := m.Allocate(ctx, &nodealloc.Request{Pools: []string{"rail0"}, ContainerID: cid, IfName: "net1",
			Meta: nodealloc.Metadata{PodName: pod, PodNamespace: "default"}}); err != nil {
			t.Fatal(err)
		}
	}
	alloc("trainer-0", "c0")

	// The cluster: node n1 with its rail label, pool rail0 giving it the block, the pod.
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := cp.Client
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pools"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"nic.hwipam.io/" + rail: "eth"}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "trainer-0", Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	sel := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "nic.hwipam.io/" + rail, Operator: corev1.NodeSelectorOpIn, Values: []string{"eth"}}}}}}
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: "pools"},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.77.0.0/24", PerNodeBlockSize: 16, Gateway: "10.77.0.1", NodeSelector: sel}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	pool.Status.Allocations = []v1alpha1.Allocation{{NodeName: "n1", StartIP: "10.77.0.16", EndIP: "10.77.0.31"}}
	if err := c.Status().Update(ctx, pool); err != nil {
		t.Fatal(err)
	}

	args := []string{"--socket", sock, "--kubeconfig", kubeconfig, "--sysfs-root", tree.Root, "--probe"}
	r, code := checkRun(t, args...)
	wantOnly(t, "healthy", r, code)
	if r.Node != "n1" || len(r.Findings) < 8 {
		t.Errorf("healthy report: %+v", r)
	}
	for _, want := range []string{"gateway 10.77.0.1 answers on " + rail, "rail NIC " + rail, "the one this daemon installed",
		"readable and consistent, 1 allocation", "(compact endpoint " + ipamwire.FastSocketPath(strings.TrimPrefix(sock, "unix://"))} {
		if !strings.Contains(fmt.Sprint(r.Findings), want) {
			t.Errorf("healthy report lacks %q: %+v", want, r.Findings)
		}
	}

	// A daemon without the plugin's compact endpoint: said, not a problem (the
	// plugin uses gRPC). The endpoint comes back for the steps below.
	fastSock := ipamwire.FastSocketPath(strings.TrimPrefix(sock, "unix://"))
	if err := os.Rename(fastSock, fastSock+".away"); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "no compact endpoint", r, code)
	if !strings.Contains(fmt.Sprint(r.Findings), "over gRPC: nothing serves its compact endpoint "+fastSock) {
		t.Errorf("without the compact endpoint, the report does not say so: %+v", r.Findings)
	}
	if err := os.Rename(fastSock+".away", fastSock); err != nil {
		t.Fatal(err)
	}

	// A pool that left this node (deleted, or no longer selecting it): a warning
	// while it holds addresses, nothing once they are gone.
	oldStart := netip.MustParseAddr("10.79.0.1")
	old := &nodealloc.PoolConfig{Name: "old", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.79.0.0/24"),
		Block: iprange.Range{Start: oldStart, End: netip.MustParseAddr("10.79.0.8")}, ExclusionBase: oldStart}
	if err := m.SetPool(old); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(ctx, &nodealloc.Request{Pools: []string{"old"}, ContainerID: "c5", IfName: "net2",
		Meta: nodealloc.Metadata{PodName: "trainer-0", PodNamespace: "default"}}); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncPools([]*nodealloc.PoolConfig{cfg}); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "a pool gone with an allocation", r, code, "no active block on this node, 1 allocation(s) kept")
	if err := m.Deallocate(ctx, &nodealloc.Request{Pools: []string{"old"}, ContainerID: "c5", IfName: "net2"}); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "a pool gone, nothing held", r, code)
	if !strings.Contains(fmt.Sprint(r.Findings), "no block on this node any more, nothing held") {
		t.Errorf("the empty pool that left is not reported: %+v", r.Findings)
	}

	// Each fault, one at a time.
	linkDownAndPoolWithoutBlock(ctx, t, c, run, rail, "10.78.0.0/24", args)

	// A rail NIC the node is labelled with but does not have (a stale or hand-set
	// label), which a pool with a block here selects.
	missing := rail + "x"
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: "n1"}, node); err != nil {
		t.Fatal(err)
	}
	node.Labels["nic.hwipam.io/"+missing] = "eth"
	if err := c.Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	mStart, mEnd := netip.MustParseAddr("10.74.0.1"), netip.MustParseAddr("10.74.0.16")
	mcfg := &nodealloc.PoolConfig{Name: "nonic", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.74.0.0/24"),
		Block: iprange.Range{Start: mStart, End: mEnd}, ExclusionBase: mStart}
	if err := m.SetPool(mcfg); err != nil {
		t.Fatal(err)
	}
	nonic := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "nonic", Namespace: "pools"},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.74.0.0/24", PerNodeBlockSize: 16, NodeSelector: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "nic.hwipam.io/" + missing, Operator: corev1.NodeSelectorOpIn, Values: []string{"eth"}}}}}}}}
	if err := c.Create(ctx, nonic); err != nil {
		t.Fatal(err)
	}
	nonic.Status.Allocations = []v1alpha1.Allocation{{NodeName: "n1", StartIP: "10.74.0.1", EndIP: "10.74.0.16"}}
	if err := c.Status().Update(ctx, nonic); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "rail NIC missing", r, code, "the pool selects rail NIC "+missing+", which this node does not have")
	if err := c.Delete(ctx, nonic); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncPools([]*nodealloc.PoolConfig{cfg}); err != nil {
		t.Fatal(err)
	}

	alloc("gone-0", "c1")
	r, code = checkRun(t, args...)
	wantOnly(t, "stale allocation", r, code, "held by pod default/gone-0, which no longer exists")
	if err := m.Deallocate(ctx, &nodealloc.Request{Pools: []string{"rail0"}, ContainerID: "c1", IfName: "net1"}); err != nil {
		t.Fatal(err)
	}

	if err := os.Rename(filepath.Join(binDir, "nv-ipam"), filepath.Join(dir, "nv-ipam.away")); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "missing plugin", r, code, "the nv-ipam plugin is not installed")
	if err := os.WriteFile(filepath.Join(binDir, "nv-ipam"), []byte("another build"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "another plugin", r, code, "not the one this daemon installed")
	if err := os.Rename(filepath.Join(dir, "nv-ipam.away"), filepath.Join(binDir, "nv-ipam")); err != nil {
		t.Fatal(err)
	}

	// A gateway nobody holds: pool rail0's gateway moved to .2.
	cfg2 := *cfg
	cfg2.Gateway = netip.MustParseAddr("10.77.0.2")
	if err := m.SetPool(&cfg2); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "unreachable gateway", r, code, "gateway 10.77.0.2 does not answer on "+rail)
	if err := m.SetPool(cfg); err != nil {
		t.Fatal(err)
	}

	// Capacity: 16 addresses, and 20 VFs on the rail.
	if err := os.WriteFile(filepath.Join(tree.Root, "sys", "bus", "pci", "devices", "0000:3b:00.0", "sriov_numvfs"), []byte("20\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "block smaller than the VFs", r, code, "the block has 16 addresses, rail NIC "+rail+" has 20 VFs configured")

	// A pod whose network names a pool the daemon does not have: the refused
	// Allocate is reported (and the capacity warning stays).
	conn, err := grpc.NewClient(sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for range 3 { // the runtime retries: reported once
		_, err = nodev1.NewIPAMServiceClient(conn).Allocate(ctx, &nodev1.AllocateRequest{Parameters: &nodev1.IPAMParameters{
			Pools: []string{"nope"}, CniContainerid: "c9", CniIfname: "net1",
			Metadata: &nodev1.IPAMMetadata{K8SPodName: "web-0", K8SPodNamespace: "default"}}})
		if status.Code(err) != codes.NotFound {
			t.Fatalf("Allocate from an unknown pool: %v", err)
		}
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "refused allocation", r, code, "an address for default/web-0 (net1, pool nope) was refused",
		"the block has 16 addresses")

	// No daemon: one error, and still a report (YAML carries the same), with exit
	// code 2: the findings are incomplete.
	var out bytes.Buffer
	err = ipamctl.Run(ctx, ipamctl.Options{Args: []string{"check", "--socket", "unix://" + filepath.Join(dir, "none.sock"),
		"--timeout", "500ms", "--store-file", filepath.Join(dir, "store"), "--cni-bin-dir", binDir, "--cni-conf-dir", confDir,
		"-o", "yaml"}, Stdout: &out, Stderr: &out})
	var y ipamctl.CheckReport
	if yerr := yaml.Unmarshal(out.Bytes(), &y); yerr != nil || ipamctl.ExitCode(err) != ipamctl.ExitUsage ||
		!strings.Contains(fmt.Sprint(problems(y)), "error daemon:") || fmt.Sprint(y.Unreachable) != "[ipam-node]" {
		t.Errorf("no daemon: exit %d (%v), %q\n%s", ipamctl.ExitCode(err), yerr, problems(y), out.String())
	}
}

// railWithGateway makes a check test's rail: veth <prefix><pid>, up, holding
// <subnet>.10/24, whose peer in a netns of its own holds the gateway <subnet>.1;
// and a sysfs tree where it is the netdev of a ConnectX-6 Dx PF with 4 of its 8
// VFs. run runs a command, failing the test when it fails.
func railWithGateway(t *testing.T, prefix, subnet string) (rail string, tree *fakesysfs.Tree, run func(args ...string)) {
	t.Helper()
	run = func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	tag := os.Getpid() % 100000
	rail, gwns := fmt.Sprintf("%s%d", prefix, tag), fmt.Sprintf("%sgw%d", prefix, tag)
	run("ip", "netns", "add", gwns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", gwns).Run() })
	run("ip", "link", "add", rail, "type", "veth", "peer", "name", rail+"p")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", rail).Run() })
	run("ip", "link", "set", rail+"p", "netns", gwns)
	run("ip", "-n", gwns, "addr", "add", subnet+".1/24", "dev", rail+"p")
	run("ip", "-n", gwns, "link", "set", rail+"p", "up")
	run("ip", "addr", "add", subnet+".10/24", "dev", rail)
	run("ip", "link", "set", rail, "up")
	tree, err := fakesysfs.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.Add(fakesysfs.Function{Address: "0000:3b:00.0", Vendor: fakesysfs.VendorNVIDIA, Device: fakesysfs.DeviceCX6Dx,
		Class: fakesysfs.ClassEthernet, Driver: "mlx5_core", NUMA: 0, TotalVFs: 8, NumVFs: 4,
		Netdevs: []fakesysfs.Netdev{{Name: rail, Type: 1, Speed: 100000, OperState: "up", MTU: 1500}}}); err != nil {
		t.Fatal(err)
	}
	return rail, tree, run
}

// check --probe resolves a pool's gateway only inside the pool's own subnet: a
// gateway outside it is not this node's neighbour to ask for, even where a route
// would send the ARP request out of the rail. Two pools share the rail's subnet:
// one whose gateway is in it (probed, and answering: probing works here), one
// whose gateway lies outside it and outside every subnet of the node, behind a
// link route on the rail. No finding names the second, and no neighbour entry is
// made for its gateway on any link.
func TestCheckDoesNotProbeGatewayOutsideSubnet(t *testing.T) {
	harness.RequireRoot(t)
	t.Setenv("KUBECONFIG", "") // no API checks: only the daemon's pools matter here
	rail, _, run := railWithGateway(t, "hwo", "10.73.0")
	outside := netip.MustParseAddr("10.72.0.1")
	run("ip", "route", "add", "10.72.0.0/24", "dev", rail) // gone with the rail
	neighOf := func(a netip.Addr) []string {
		t.Helper()
		neighs, err := netlink.NeighList(0, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range neighs {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
				out = append(out, fmt.Sprintf("link %d state %#x", n.LinkIndex, n.State))
			}
		}
		return out
	}
	if got := neighOf(outside); len(got) > 0 {
		t.Fatalf("before the check, %s already has neighbour entries: %v", outside, got)
	}

	subnet := netip.MustParsePrefix("10.73.0.0/24")
	pool := func(name, start, end, gw string) *nodealloc.PoolConfig {
		s := netip.MustParseAddr(start)
		return &nodealloc.PoolConfig{Name: name, Kind: v1alpha1.KindIPPool, Prefix: subnet,
			Block: iprange.Range{Start: s, End: netip.MustParseAddr(end)}, ExclusionBase: s, Gateway: netip.MustParseAddr(gw)}
	}
	dir := t.TempDir()
	sock, _ := harness.ServeNodeIn(t, dir, nil, pool("inside", "10.73.0.16", "10.73.0.31", "10.73.0.1"),
		pool("outside", "10.73.0.32", "10.73.0.47", outside.String()))
	r, _ := checkRun(t, "--socket", sock, "--store-file", filepath.Join(dir, "store"), "--cni-bin-dir", dir,
		"--cni-conf-dir", dir, "--probe")

	var gateways []string
	for _, f := range r.Findings {
		if f.Check == "gateway" {
			gateways = append(gateways, f.Subject+": "+f.Message)
		}
	}
	if want := "inside: gateway 10.73.0.1 answers on " + rail; len(gateways) != 1 || !strings.HasPrefix(gateways[0], want) {
		t.Errorf("gateway findings %q, want only one starting %q", gateways, want)
	}
	if got := neighOf(outside); len(got) > 0 {
		t.Errorf("check --probe made neighbour entries for %s, outside pool outside's subnet %s: %v", outside, subnet, got)
	}
}

// linkDownAndPoolWithoutBlock makes two faults of the check tests, one after the
// other, and wants check to find each: the rail's link down (a problem naming the
// rail NIC; the gateway is then unreachable too, its address being on a link that
// is down), and an IPPool in subnet that selects the node but gives it no block.
func linkDownAndPoolWithoutBlock(ctx context.Context, t *testing.T, c client.Client, run func(args ...string), rail, subnet string, args []string) {
	t.Helper()
	run("ip", "link", "set", rail, "down")
	r, code := checkRun(t, args...)
	if got := problems(r); code != ipamctl.ExitProblems || !strings.Contains(fmt.Sprint(got), "rail NIC "+rail+" (0000:3b:00.0) is down") {
		t.Errorf("link down: exit %d, %q", code, got)
	}
	run("ip", "link", "set", rail, "up")

	nobl := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "nobl", Namespace: "pools"},
		Spec: v1alpha1.IPPoolSpec{Subnet: subnet, PerNodeBlockSize: 16}}
	if err := c.Create(ctx, nobl); err != nil {
		t.Fatal(err)
	}
	r, code = checkRun(t, args...)
	wantOnly(t, "pool without block", r, code, "IPPool pools/nobl selects this node but gives it no block")
	if err := c.Delete(ctx, nobl); err != nil {
		t.Fatal(err)
	}
}

// nodeDirs makes a check test's node directory and, in it, the CNI bin and conf
// directories the daemon installs into.
func nodeDirs(t *testing.T) (dir, binDir, confDir string) {
	t.Helper()
	dir = t.TempDir()
	binDir, confDir = filepath.Join(dir, "bin"), filepath.Join(dir, "conf")
	for _, d := range []string{binDir, confDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir, binDir, confDir
}

// installedPlugin puts a stand-in nv-ipam plugin in binDir and returns its
// SHA-256 in hex, as the daemon reports the plugin it installed.
func installedPlugin(t *testing.T, binDir string) string {
	t.Helper()
	plugin := []byte("#!/bin/sh\nexit 0\n")
	if err := os.WriteFile(filepath.Join(binDir, "nv-ipam"), plugin, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(plugin)
	return hex.EncodeToString(sum[:])
}
