package ipamctl_test

import (
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/test/harness"
)

// nadControlPlane is a real API server with the pool CRDs and the
// NetworkAttachmentDefinition CRD, its client and a kubeconfig for ipamctl.
func nadControlPlane(t *testing.T) (client.Client, string) {
	t.Helper()
	crds := t.TempDir()
	b, err := os.ReadFile(filepath.Join("..", "..", "test", "realnode", "nad-crd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(crds, "nad.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	scheme, err := v1alpha1.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	if err := nadv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := nodeipamv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cp, err := harness.NewControlPlane(harness.ControlPlaneOptions{ClientOptions: &client.Options{Scheme: scheme},
		CRDDirs: []string{filepath.Join(harness.RepoRoot(), "deploy", "crds"), crds}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return cp.Client, kubeconfig
}

// pools --cluster and check --cluster read pools, nodes and the
// NetworkAttachmentDefinitions (their real CRD) from a real API server: which
// pools each NAD uses, found the way Multus reads a config (one plugin or a
// plugin list, poolName or the network's name), NADs naming no pool, and a NAD
// whose master netdev is on a node its pool does not select.
func TestClusterPoolsAndNADs(t *testing.T) {
	c, kubeconfig := nadControlPlane(t)
	ctx := t.Context()
	nad := func(name, config string) client.Object {
		return &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: config}}
	}
	onlyA := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"n-a"}}}}}}
	objs := []client.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n-a", Labels: map[string]string{"kubernetes.io/hostname": "n-a", "nic.hwipam.io/ens1": "eth"}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n-b", Labels: map[string]string{"kubernetes.io/hostname": "n-b", "nic.hwipam.io/ens1": "eth"}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n-c", Labels: map[string]string{"kubernetes.io/hostname": "n-c"}}},
		&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "kube-system"},
			Spec: v1alpha1.IPPoolSpec{Subnet: "10.50.0.0/24", PerNodeBlockSize: 32, NodeSelector: onlyA}},
		&v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "kube-system"},
			Spec: v1alpha1.CIDRPoolSpec{CIDR: "10.60.0.0/16", PerNodeNetworkPrefix: 24}},
		&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "nowhere", Namespace: "kube-system"},
			Spec: v1alpha1.IPPoolSpec{Subnet: "10.70.0.0/24", PerNodeBlockSize: 32, NodeSelector: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: "nic.hwipam.io/ibp999s0", Operator: corev1.NodeSelectorOpExists}}}}}}},
		nad("single", `{"cniVersion":"1.0.0","name":"single","type":"macvlan","master":"ens1","ipam":{"type":"nv-ipam","poolName":"p1"}}`),
		nad("list", `{"cniVersion":"1.0.0","name":"list","plugins":[{"type":"macvlan","master":"ens9",
			"ipam":{"type":"nv-ipam","poolName":"p1,c1"}},{"type":"tuning"}]}`),
		nad("byname", `{"cniVersion":"1.0.0","name":"c1","type":"host-device","device":"ens9","ipam":{"type":"nv-ipam","poolType":"cidrpool"}}`),
		// No name in the config: Multus names the network after the NAD, and the pool
		// after the network.
		nad("c1", `{"cniVersion":"1.0.0","type":"host-device","device":"ens9","ipam":{"type":"nv-ipam"}}`),
		nad("missing", `{"cniVersion":"1.0.0","name":"missing","type":"macvlan","master":"ens1","ipam":{"type":"nv-ipam","poolName":"nope"}}`),
		nad("wrongtype", `{"cniVersion":"1.0.0","name":"w","type":"macvlan","ipam":{"type":"nv-ipam","poolName":"p1","poolType":"cidrpool"}}`),
		nad("other", `{"cniVersion":"1.0.0","name":"other","type":"macvlan","ipam":{"type":"host-local","subnet":"10.9.0.0/24"}}`),
		nad("broken", `{"cniVersion":"1.0.0","name":`),
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	p1 := &v1alpha1.IPPool{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "p1"}, p1); err != nil {
		t.Fatal(err)
	}
	p1.Status.Allocations = []v1alpha1.Allocation{{NodeName: "n-a", StartIP: "10.50.0.1", EndIP: "10.50.0.32"}}
	if err := c.Status().Update(ctx, p1); err != nil {
		t.Fatal(err)
	}

	out := string(sameJSONAndYAML(t, "pools", "--cluster", "--kubeconfig", kubeconfig))
	roundTrip[ipamctl.ClusterReport](t, "pools --cluster", []byte(out))
	var r ipamctl.ClusterReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	byName := map[string]ipamctl.ClusterPool{}
	for _, p := range r.Pools {
		byName[p.Name] = p
	}
	if p := byName["p1"]; p.Selected != 1 || p.Blocks["n-a"] != "10.50.0.1-10.50.0.32" || len(p.WithoutBlock) != 0 ||
		p.UsableBlocks != 7 || !slices.Equal(p.NADs, []string{"default/list", "default/single"}) && !slices.Equal(p.NADs, []string{"default/single", "default/list"}) {
		t.Errorf("p1: %+v", p)
	}
	if p := byName["c1"]; p.Selected != 3 || len(p.WithoutBlock) != 3 || p.UsableBlocks != 256 ||
		!slices.Equal(slices.Sorted(slices.Values(p.NADs)), []string{"default/byname", "default/c1", "default/list"}) {
		t.Errorf("c1: %+v", p)
	}
	if !slices.Contains(r.NADsWithoutPool, "default/missing names nope") || !slices.Contains(r.NADsWithoutPool, "default/wrongtype names p1") ||
		len(r.NADsWithoutPool) != 2 {
		t.Errorf("NADs without pool: %q", r.NADsWithoutPool)
	}
	if p := byName["nowhere"]; p.Selected != 0 || len(p.WithoutBlock) != 0 {
		t.Errorf("nowhere: %+v", p)
	}
	table, err := run(t, "pools", "--cluster", "--kubeconfig", kubeconfig)
	if err != nil || !strings.Contains(table, "NAD without pool: default/missing names nope") || !strings.Contains(table, "n-a,n-b,n-c") ||
		!regexp.MustCompile(`(?m)^nowhere\s+IPPool\s+-\s+10\.70\.0\.0/24\s+0 \(selects no node\)\s+0\s+-\s+0/7 \(0\.0%\)\s+-\s+-\s+status$`).MatchString(table) ||
		regexp.MustCompile(`(?m)^POOL\s+KIND\s+NODE\s+BLOCK`).MatchString(table) {
		t.Errorf("table (%v):\n%s", err, table)
	}
	// --list adds each node's block, pool by pool.
	table, err = run(t, "pools", "--cluster", "--list", "--kubeconfig", kubeconfig)
	if err != nil || !regexp.MustCompile(`(?m)^POOL\s+KIND\s+NODE\s+BLOCK\np1\s+IPPool\s+n-a\s+10\.50\.0\.1-10\.50\.0\.32$`).MatchString(table) {
		t.Errorf("table with --list (%v):\n%s", err, table)
	}
	if _, err := run(t, "pools", "--list"); ipamctl.ExitCode(err) != ipamctl.ExitUsage {
		t.Errorf("pools --list without --cluster: %v", err)
	}

	// check --cluster (no daemon here: that is one more error, ignored below, and
	// makes the exit code 2).
	rep, code := checkRun(t, "--cluster", "--kubeconfig", kubeconfig, "--node-name", "n-a", "--ippools-namespace", "kube-system",
		"--socket", "unix://"+filepath.Join(t.TempDir(), "none.sock"), "--timeout", "300ms")
	var nads []string
	for _, f := range rep.Findings {
		if f.Check == "nad" {
			nads = append(nads, f.Severity+": "+f.Message)
		}
	}
	for _, want := range []string{
		`error: NAD default/missing names pool "nope", which does not exist in kube-system`,
		`error: NAD default/wrongtype names cidrpool "p1", which does not exist in kube-system`,
		"warning: NAD default/single uses master ens1, which node n-b has, but IPPool p1 does not select that node",
		"error: default/broken: config does not parse",
	} {
		if !slices.ContainsFunc(nads, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("check --cluster lacks %q: %q", want, nads)
		}
	}
	if len(nads) != 4 || code != ipamctl.ExitUsage || !slices.Equal(rep.Unreachable, []string{"ipam-node"}) {
		t.Errorf("check --cluster: exit %d, unreachable %q, NAD findings %q", code, rep.Unreachable, nads)
	}

	// Healthy: without the faulty NADs, and with n-b off the ens1 NAD's rail, the
	// NAD check says only that all is well.
	for _, name := range []string{"missing", "wrongtype", "broken"} {
		if err := c.Delete(ctx, nad(name, "")); err != nil {
			t.Fatal(err)
		}
	}
	nb := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: "n-b"}, nb); err != nil {
		t.Fatal(err)
	}
	delete(nb.Labels, "nic.hwipam.io/ens1")
	if err := c.Update(ctx, nb); err != nil {
		t.Fatal(err)
	}
	rep, _ = checkRun(t, "--cluster", "--kubeconfig", kubeconfig, "--node-name", "n-a", "--ippools-namespace", "kube-system",
		"--socket", "unix://"+filepath.Join(t.TempDir(), "none.sock"), "--timeout", "300ms")
	nads = nil
	for _, f := range rep.Findings {
		if f.Check == "nad" {
			nads = append(nads, f.Severity+": "+f.Message)
		}
	}
	if want := "ok: 4 nv-ipam NAD section(s) name existing pools that select their nodes"; len(nads) != 1 || nads[0] != want {
		t.Errorf("check --cluster on healthy NADs: %q, want only %q", nads, want)
	}
}

// An API server that accepts connections and never answers: pools --cluster and
// check report it within --timeout instead of hanging.
func TestClusterUnreachableAPIServer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close() // never accepted: the TLS handshake hangs
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://`+lis.Addr().String()+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = run(t, "pools", "--cluster", "--kubeconfig", kubeconfig, "--timeout", "500ms")
	if ipamctl.ExitCode(err) != ipamctl.ExitUsage || time.Since(start) > 10*time.Second {
		t.Errorf("pools --cluster against a silent API server: exit %d after %s: %v", ipamctl.ExitCode(err), time.Since(start), err)
	}
	start = time.Now()
	r, code := checkRun(t, "--kubeconfig", kubeconfig, "--node-name", "n1", "--timeout", "500ms",
		"--socket", "unix://"+filepath.Join(t.TempDir(), "none.sock"))
	if code != ipamctl.ExitUsage || time.Since(start) > 10*time.Second || !slices.Contains(r.Unreachable, "the API server") ||
		!slices.ContainsFunc(r.Findings, func(f ipamctl.Finding) bool { return f.Check == "api" && f.Severity == ipamctl.SeverityError }) {
		t.Errorf("check against a silent API server: exit %d after %s: %+v", code, time.Since(start), r.Findings)
	}
}

// railsWalkThrough reads the eight rail IPPools and the NAD of docs/rails.md's
// walk-through, as the page gives them.
func railsWalkThrough(t *testing.T) ([]*v1alpha1.IPPool, *nadv1.NetworkAttachmentDefinition) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "docs", "rails.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The walk-through's section only: the IPoIB one after it has its own.
	walk, _, _ := strings.Cut(string(doc), "\n## IPoIB")
	_, walk, _ = strings.Cut(walk, "\n## Walk-through")
	var pools []*v1alpha1.IPPool
	var nad *nadv1.NetworkAttachmentDefinition
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(walk, -1) {
		for _, part := range strings.Split(m[1], "\n---\n") {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(part), &meta); err != nil {
				t.Fatalf("docs/rails.md: %v\n%s", err, part)
			}
			switch meta.Kind {
			case "IPPool":
				p := &v1alpha1.IPPool{}
				if err := yaml.UnmarshalStrict([]byte(part), p); err != nil {
					t.Fatal(err)
				}
				pools = append(pools, p)
			case "NetworkAttachmentDefinition":
				nad = &nadv1.NetworkAttachmentDefinition{}
				if err := yaml.UnmarshalStrict([]byte(part), nad); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if len(pools) != 8 || nad == nil {
		t.Fatalf("docs/rails.md: %d IPPools and NAD %v, want the walk-through's eight pools and its NAD", len(pools), nad)
	}
	return pools, nad
}

// pools --cluster and check --cluster on rail networks (docs/rails.md): the
// walk-through's NAD ("rail": "auto", a device from the device plugin) reaches
// every rail pool and is healthy while each rail's pool has a block on each node
// with the rail; a macvlan NAD with "auto" takes its master's rail (named by the
// rail map's label where there is one); a named rail reaches its pools. Then the
// faults the plugin would meet: a rail no pool is labelled for, a rail pool
// without a block on a node with the rail, three pools on one rail, rail and
// poolName both set.
func TestClusterRailNADs(t *testing.T) {
	c, kubeconfig := nadControlPlane(t)
	ctx := t.Context()
	pools, walkNAD := railsWalkThrough(t)
	dgxRails := []string{"ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0", "ibp154s0", "ibp192s0", "ibp206s0", "ibp220s0"}
	dgx := func(name string) *corev1.Node {
		l := map[string]string{"kubernetes.io/hostname": name, "nic.hwipam.io/present": "true",
			"nic.hwipam.io/eno1np0": "eth", "nic.hwipam.io/eno1np0.model": "ConnectX-6_Dx"} // a management port: no rail pool
		for _, r := range dgxRails {
			l["nic.hwipam.io/"+r] = "ib"
			l["nic.hwipam.io/"+r+".model"] = "ConnectX-7"
		}
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
	}
	nad := func(name, config string) *nadv1.NetworkAttachmentDefinition {
		return &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: config}}
	}
	eastSel := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "nic.hwipam.io/rail.east", Operator: corev1.NodeSelectorOpExists}}}}}
	objs := []client.Object{dgx("dgx-1"), dgx("dgx-2"),
		// A node whose rail map names its port's rail "east".
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "eth-1", Labels: map[string]string{"nic.hwipam.io/ens1f0np0": "eth",
			"nic.hwipam.io/rail.east": "ens1f0np0"}}},
		&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "east", Namespace: "kube-system", Labels: map[string]string{"nic.hwipam.io/rail": "east"}},
			Spec: v1alpha1.IPPoolSpec{Subnet: "10.120.0.0/24", PerNodeBlockSize: 32, NodeSelector: eastSel}},
		walkNAD,
		nad("east-macvlan", `{"cniVersion":"1.0.0","name":"east-macvlan","type":"macvlan","master":"ens1f0np0",
			"ipam":{"type":"nv-ipam","rail":"auto"}}`),
		nad("rail-24", `{"cniVersion":"1.0.0","name":"rail-24","type":"ib-sriov","ipam":{"type":"nv-ipam","rail":"ibp24s0"}}`),
	}
	for _, p := range pools {
		objs = append(objs, p)
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// The controller's blocks: every rail pool on both DGX nodes, east on eth-1.
	setBlocks := func(name string, nodes ...string) {
		t.Helper()
		p := &v1alpha1.IPPool{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: name}, p); err != nil {
			t.Fatal(err)
		}
		base := netip.MustParsePrefix(p.Spec.Subnet).Addr()
		p.Status.Allocations = nil
		for i, n := range nodes {
			start := base
			for range 1 + 64*i {
				start = start.Next()
			}
			end := start
			for range 63 {
				end = end.Next()
			}
			p.Status.Allocations = append(p.Status.Allocations, v1alpha1.Allocation{NodeName: n, StartIP: start.String(), EndIP: end.String()})
		}
		if err := c.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pools {
		setBlocks(p.Name, "dgx-1", "dgx-2")
	}
	setBlocks("east", "eth-1")

	nadFindings := func() (out []string) {
		t.Helper()
		rep, _ := checkRun(t, "--cluster", "--kubeconfig", kubeconfig, "--node-name", "dgx-1", "--ippools-namespace", "kube-system",
			"--socket", "unix://"+filepath.Join(t.TempDir(), "none.sock"), "--timeout", "300ms")
		for _, f := range rep.Findings {
			if f.Check == "nad" {
				out = append(out, f.Severity+": "+f.Message)
			}
		}
		return out
	}
	report := func() (ipamctl.ClusterReport, map[string]ipamctl.ClusterPool) {
		t.Helper()
		out := sameJSONAndYAML(t, "pools", "--cluster", "--kubeconfig", kubeconfig)
		roundTrip[ipamctl.ClusterReport](t, "pools --cluster", out)
		var r ipamctl.ClusterReport
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatal(err)
		}
		byName := map[string]ipamctl.ClusterPool{}
		for _, p := range r.Pools {
			slices.Sort(p.NADs)
			byName[p.Name] = p
		}
		return r, byName
	}

	// Healthy: no NAD without pool, each rail pool lists the NADs that reach it,
	// and check --cluster says only that all is well.
	r, byName := report()
	if len(r.NADsWithoutPool) != 0 || len(r.NADsRefused) != 0 {
		t.Errorf("healthy rails: NADs without pool %q, refused %q", r.NADsWithoutPool, r.NADsRefused)
	}
	for i, p := range pools {
		want := []string{"default/rails"}
		if i == 0 {
			want = []string{"default/rail-24", "default/rails"}
		}
		if got := byName[p.Name]; !slices.Equal(got.NADs, want) || got.Rail != dgxRails[i] {
			t.Errorf("pool %s: rail %q, NADs %q; want rail %s, NADs %q", p.Name, got.Rail, got.NADs, dgxRails[i], want)
		}
	}
	// The walk-through's NAD reaches east too: eth-1 has that rail, and a device
	// plugin may give it a device there.
	if got := byName["east"].NADs; !slices.Equal(got, []string{"default/east-macvlan", "default/rails"}) {
		t.Errorf("pool east: NADs %q, want the macvlan NAD whose master is on rail east, and the walk-through's", got)
	}
	table, err := run(t, "pools", "--cluster", "--kubeconfig", kubeconfig)
	if err != nil || strings.Contains(table, "NAD without pool") || !regexp.MustCompile(`(?m)^dgx-rail0\s+IPPool\s+ibp24s0\s`).MatchString(table) {
		t.Errorf("pools --cluster on healthy rails (%v):\n%s", err, table)
	}
	want := "ok: 3 nv-ipam NAD section(s) find their pools: 0 by name, which select their nodes, and 3 by rail, " +
		"whose pools have a block on each node with the rail"
	if got := nadFindings(); len(got) != 1 || got[0] != want {
		t.Errorf("check --cluster on healthy rail NADs: %q, want only %q", got, want)
	}

	// Faults.
	setBlocks("dgx-rail3", "dgx-1") // dgx-2 has ibp94s0, but no block of its pool
	for _, o := range []client.Object{
		nad("rail-missing", `{"cniVersion":"1.0.0","name":"rail-missing","type":"ib-sriov","ipam":{"type":"nv-ipam","rail":"ibp999s0"}}`),
		nad("mgmt", `{"cniVersion":"1.0.0","name":"mgmt","type":"macvlan","master":"eno1np0","ipam":{"type":"nv-ipam","rail":"auto"}}`),
		nad("both", `{"cniVersion":"1.0.0","name":"both","type":"macvlan","ipam":{"type":"nv-ipam","rail":"auto","poolName":"dgx-rail0"}}`),
		nad("crowded", `{"cniVersion":"1.0.0","name":"crowded","type":"ib-sriov","ipam":{"type":"nv-ipam","rail":"east2"}}`),
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"e1", "e2", "e3"} {
		if err := c.Create(ctx, &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system",
			Labels: map[string]string{"nic.hwipam.io/rail": "east2"}},
			Spec: v1alpha1.IPPoolSpec{Subnet: "10.13" + name[1:] + ".0.0/24", PerNodeBlockSize: 32, NodeSelector: eastSel}}); err != nil {
			t.Fatal(err)
		}
	}
	got := nadFindings()
	for _, want := range []string{
		`error: NAD default/rail-missing: rail "ibp999s0": no IPPool in namespace kube-system is labelled nic.hwipam.io/rail=ibp999s0`,
		`error: NAD default/mgmt: rail "eno1np0": no IPPool in namespace kube-system is labelled nic.hwipam.io/rail=eno1np0 (the rail of its master eno1np0)`,
		`error: NAD default/both: ipam.rail "auto" and poolName "dgx-rail0" are both set: the plugin refuses it (code 7)`,
		`error: NAD default/crowded: rail "east2": 3 IPPools are labelled nic.hwipam.io/rail=east2 (e1, e2, e3); a rail has one pool, or two for dual-stack`,
		`warning: NAD default/rails reaches IPPool dgx-rail3 by rail, and the pool has no block on node(s) dgx-2, which have its rail`,
	} {
		if !slices.Contains(got, want) {
			t.Errorf("check --cluster lacks %q:\n%s", want, strings.Join(got, "\n"))
		}
	}
	if len(got) != 5 {
		t.Errorf("check --cluster: %d NAD findings, want the 5 faults:\n%s", len(got), strings.Join(got, "\n"))
	}
	r, byName = report()
	if want := []string{`default/mgmt rail "eno1np0" (no IPPool labelled nic.hwipam.io/rail=eno1np0)`,
		`default/rail-missing rail "ibp999s0" (no IPPool labelled nic.hwipam.io/rail=ibp999s0)`}; !slices.Equal(slices.Sorted(slices.Values(r.NADsWithoutPool)), want) {
		t.Errorf("NADs without pool: %q, want %q", r.NADsWithoutPool, want)
	}
	if want := []string{`default/both: ipam.rail "auto" and poolName "dgx-rail0" are both set: the plugin refuses it (code 7)`,
		`default/crowded: rail "east2" has 3 IPPools (e1, e2, e3)`}; !slices.Equal(slices.Sorted(slices.Values(r.NADsRefused)), want) {
		t.Errorf("NADs refused: %q, want %q", r.NADsRefused, want)
	}
	if got := byName["dgx-rail0"].NADs; !slices.Equal(got, []string{"default/rail-24", "default/rails"}) {
		t.Errorf("dgx-rail0 lists %q: a NAD the plugin refuses is not one that uses it", got)
	}
	table, _ = run(t, "pools", "--cluster", "--kubeconfig", kubeconfig)
	if !strings.Contains(table, `NAD refused by the plugin: default/both`) || !strings.Contains(table, `NAD without pool: default/rail-missing rail "ibp999s0"`) {
		t.Errorf("pools --cluster with faulty rail NADs:\n%s", table)
	}
}

// Issue 39, item 6: pools --cluster listed a pool's NADs but not the DRA claims
// with addresses from it, and a NAD whose master a claim holds showed only
// "Link not found" on its pods. Now the pool lists its claims (from their
// status), and check --cluster names the claim that holds the NAD's master.
func TestClusterDRAClaims(t *testing.T) {
	c, kubeconfig := nadControlPlane(t)
	ctx := t.Context()
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail-ibp79s0", Namespace: "kube-system",
		Labels: map[string]string{v1alpha1.LabelRail: "ibp79s0"}}, Spec: v1alpha1.IPPoolSpec{Subnet: "10.79.0.0/16", PerNodeBlockSize: 64}}
	nad := &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Name: "on-79", Namespace: "default"},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"1.0.0","name":"on-79","type":"macvlan","master":"ibp79s0",` +
			`"ipam":{"type":"nv-ipam","poolName":"rail-ibp79s0"}}`}}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "gpu-nic", Namespace: "ml"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "nic",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicdra.DriverName}}}}}}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []client.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n-1"}}, pool, nad, claim} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	data, err := json.Marshal(nicdra.DeviceData{Pools: []string{"rail-ibp79s0"}, PoolType: "ippool", Rail: "ibp79s0",
		HostNetdev: "ibp79s0", PCIAddress: "0000:4f:00.0"})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "nic", Driver: nicdra.DriverName, Pool: "n-1", Device: "pci-0000-4f-00-0"}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n-1"}}}}}}}
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: nicdra.DriverName, Pool: "n-1", Device: "pci-0000-4f-00-0",
		Data: &runtime.RawExtension{Raw: data}, NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "net1", IPs: []string{"10.79.0.5/16"}}}}
	if err := c.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "pools", "--cluster", "--kubeconfig", kubeconfig, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var r ipamctl.ClusterReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(r.Pools) != 1 || !slices.Equal(r.Pools[0].Claims, []string{"ml/gpu-nic"}) || !slices.Equal(r.Pools[0].NADs, []string{"default/on-79"}) {
		t.Errorf("pools --cluster: %+v, want rail-ibp79s0 with NAD default/on-79 and claim ml/gpu-nic", r.Pools)
	}
	table, err := run(t, "pools", "--cluster", "--kubeconfig", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table, "DRA CLAIMS") || !strings.Contains(table, "ml/gpu-nic") {
		t.Errorf("pools --cluster table lacks the claim:\n%s", table)
	}
	cr, _ := checkRun(t, "--cluster", "--kubeconfig", kubeconfig, "--socket", "unix:///nonexistent.sock", "--node-name", "n-1")
	found := false
	for _, f := range cr.Findings {
		if f.Check == "nad" && strings.Contains(f.Message, "NAD default/on-79 uses master ibp79s0, which DRA claim ml/gpu-nic holds on node n-1") {
			found = f.Severity == ipamctl.SeverityWarning && f.Fix != ""
		}
	}
	if !found {
		t.Errorf("check --cluster does not name the claim holding the NAD's master: %+v", cr.Findings)
	}
	// And lists the ports claims hold, for a pod left with "cannot allocate
	// all claims".
	if !slices.ContainsFunc(cr.Findings, func(f ipamctl.Finding) bool {
		return f.Check == "dra-claims" && f.Subject == "claim ml/gpu-nic" &&
			strings.Contains(f.Message, "holds port pci-0000-4f-00-0 (ibp79s0, 0000:4f:00.0) on node n-1, rail ibp79s0, pool(s) rail-ibp79s0, address(es) 10.79.0.5/16")
	}) {
		t.Errorf("check --cluster does not list the port the claim holds: %+v", cr.Findings)
	}
}

// TestClusterRecordFindings: check --cluster reads the NodeIPAMs, the records
// ipam-controller plans from, and says which one someone else wrote (its daemon
// ignores it), which is being deleted (held by the controller's finalizer), and
// which block a record gives that the pool's status does not list (the status
// writes are not going through); and that all is well when none of these is so.
func TestClusterRecordFindings(t *testing.T) {
	c, kubeconfig := nadControlPlane(t)
	ctx := t.Context()
	const ns = "kube-system"
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: ns},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.7.0.0/24", PerNodeBlockSize: 16}}
	for _, o := range []client.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n-1"}}, pool} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	pool.Status.Allocations = []v1alpha1.Allocation{{NodeName: "n-1", StartIP: "10.7.0.1", EndIP: "10.7.0.16"}}
	if err := c.Status().Update(ctx, pool); err != nil {
		t.Fatal(err)
	}
	record := func(node, start, end string) *nodeipamv1.NodeIPAM {
		return &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: node},
			Spec: nodeipamv1.NodeIPAMSpec{Blocks: []nodeipamv1.NodeBlock{{Kind: v1alpha1.KindIPPool, Pool: "rail0", PoolUID: pool.UID,
				StartIP: start, EndIP: end}}}}
	}
	if err := c.Create(ctx, record("n-1", "10.7.0.1", "10.7.0.16"), client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	records := func() []ipamctl.Finding {
		t.Helper()
		cr, _ := checkRun(t, "--cluster", "--kubeconfig", kubeconfig, "--socket", "unix:///nonexistent.sock", "--node-name", "n-1")
		var out []ipamctl.Finding
		for _, f := range cr.Findings {
			if f.Check == "records" {
				out = append(out, f)
			}
		}
		return out
	}
	if got := records(); len(got) != 1 || got[0].Severity != ipamctl.SeverityOK {
		t.Fatalf("one record that agrees with the status: %+v", got)
	}
	// n-2's record gives a block the status does not list; n-3's was written
	// by hand; n-4's is being deleted.
	if err := c.Create(ctx, record("n-2", "10.7.0.17", "10.7.0.32"), client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, record("n-3", "10.7.0.33", "10.7.0.48"), client.FieldOwner("kubectl-create")); err != nil {
		t.Fatal(err)
	}
	held := record("n-4", "10.7.0.49", "10.7.0.64")
	held.Finalizers = []string{nodeipamv1.Finalizer}
	if err := c.Create(ctx, held, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, held); err != nil {
		t.Fatal(err)
	}
	// n-5's record keeps a retired block, still reserved, inside n-1's block:
	// two records claim it.
	until := metav1.NewTime(time.Now().Add(time.Hour))
	retired := &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "n-5"},
		Spec: nodeipamv1.NodeIPAMSpec{Retired: []nodeipamv1.RetiredBlock{{Kind: v1alpha1.KindIPPool, Pool: "rail0", PoolUID: pool.UID,
			Range: "10.7.0.9-10.7.0.16", Since: metav1.Now(), ReservedUntil: &until}}}}
	if err := c.Create(ctx, retired, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"NodeIPAM kube-system/n-1": ipamctl.SeverityError + ": IPPool rail0: node n-1's block 10.7.0.1-10.7.0.16 and node n-5's " +
			"retired block 10.7.0.9-10.7.0.16 (reserved until",
		"NodeIPAM kube-system/n-2": ipamctl.SeverityWarning + ": IPPool rail0's status does not list node n-2's block 10.7.0.17-10.7.0.32",
		"NodeIPAM kube-system/n-3": ipamctl.SeverityError + ": NodeIPAM n-3 was written by someone other than ipam-controller",
		"NodeIPAM kube-system/n-4": ipamctl.SeverityWarning + ": NodeIPAM n-4 is being deleted: its finalizer ipam.hwipam.io/record keeps it",
	}
	got := records()
	if len(got) != len(want) {
		t.Fatalf("record findings %+v, want one for each of %v", got, want)
	}
	for _, f := range got {
		w, ok := want[f.Subject]
		if !ok || !strings.HasPrefix(f.Severity+": "+f.Message, w) || f.Fix == "" {
			t.Errorf("finding %+v, want %q with a fix", f, w)
		}
	}
	// Taken off by hand (as uninstall does): gone.
	if err := c.Patch(ctx, held, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
		t.Fatal(err)
	}
}
