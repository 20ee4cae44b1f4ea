package ipamctl_test

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/test/harness"
)

// pools --cluster and check --cluster read pools, nodes and the
// NetworkAttachmentDefinitions (their real CRD) from a real API server: which
// pools each NAD uses, found the way Multus reads a config (one plugin or a
// plugin list, poolName or the network's name), NADs naming no pool, and a NAD
// whose master netdev is on a node its pool does not select.
func TestClusterPoolsAndNADs(t *testing.T) {
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
	ctx := t.Context()
	c := cp.Client
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
	table, err := run(t, "pools", "--cluster", "--kubeconfig", kubeconfig)
	if err != nil || !strings.Contains(table, "NAD without pool: default/missing names nope") || !strings.Contains(table, "n-a,n-b,n-c") ||
		strings.Contains(table, "NODE") {
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
