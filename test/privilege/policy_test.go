package privilege

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/test/harness"
)

// What the policy says when it refuses (deploy/policy/node.yaml).
const (
	msgNoNodeName = "this token carries no node name"
	msgOwnNode    = "may change only its own Node, not "
	msgLabels     = "may change only the labels under nic.hwipam.io/ on its Node, not "
	msgAnnots     = "may change only the annotations ipam.hwipam.io/pools-in-use and ipam.hwipam.io/held on its Node, not "
	msgSpec       = "may not change a Node's spec"
	msgFinalizers = "may not change a Node's finalizers or owner references"
)

// TestNodeDaemonConfinedToItsNode applies deploy/base's service accounts, RBAC and
// admission policies to a real API server and acts with tokens of the node
// daemon's service account bound to pods on node-a and node-b, as the kubelet
// issues them: the real ipam-node binary labels and annotates its own Node; every
// other write - another Node, a foreign label, annotation or taint, a token
// without a node - is refused with the policy's message.
func TestNodeDaemonConfinedToItsNode(t *testing.T) {
	e := startEnv(t)
	ctx := t.Context()
	before := map[string]corev1.Node{}
	for _, n := range []string{"node-a", "node-b"} {
		before[n] = e.createNode(t, n)
	}
	tokA, tokB := e.token(t, e.daemonPod(t, "node-a")), e.token(t, e.daemonPod(t, "node-b"))
	asA, asB, asNone := e.as(tokA), e.as(tokB), e.as(e.token(t, nil))

	t.Run("a pod-bound token carries its node", func(t *testing.T) {
		if got := whoami(t, asA).Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != "node-a" {
			t.Fatalf("node-name of node-a's token = %v", got)
		}
		if got, ok := whoami(t, asNone).Extra["authentication.kubernetes.io/node-name"]; ok {
			t.Fatalf("an unbound token carries node-name %v", got)
		}
	})
	// In force once a foreign label is refused by the policy (a dry run changes nothing).
	eventually(t, 30*time.Second, "the node policy in force", func() error {
		err := mergePatchNode(ctx, asA, "node-a", labelsPatch(map[string]any{"team": "x"}), true)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "hwipam-node-own-node") {
			return nil
		}
		return fmt.Errorf("a foreign label is not refused by the policy yet: %w", err)
	})

	// What the daemon writes, written directly.
	t.Run("nic.hwipam.io labels by server-side apply on its own node", func(t *testing.T) {
		if err := applyNICLabels(ctx, asA, "node-a", map[string]string{"nic.hwipam.io/present": "true"}); err != nil {
			t.Fatal(err)
		}
		if err := applyNICLabels(ctx, asA, "node-a", map[string]string{}); err != nil {
			t.Fatalf("removing its own labels: %v", err)
		}
	})
	t.Run("pools annotations by merge patch on its own node", func(t *testing.T) {
		if err := mergePatchNode(ctx, asA, "node-a", annotationsPatch(map[string]any{
			v1alpha1.PoolsInUseAnnotation: "p", v1alpha1.HeldAnnotation: "{}"}), false); err != nil {
			t.Fatal(err)
		}
		if err := mergePatchNode(ctx, asA, "node-a", annotationsPatch(map[string]any{
			v1alpha1.PoolsInUseAnnotation: nil, v1alpha1.HeldAnnotation: nil}), false); err != nil {
			t.Fatalf("removing its own annotations: %v", err)
		}
	})

	refused := []struct {
		name string
		cfg  *rest.Config
		node string
		// patch is a merge patch; nil means the daemon's server-side apply of one NIC label.
		patch map[string]any
		want  string
	}{
		{"NIC labels on another node", asA, "node-b", nil, "on node node-a " + msgOwnNode + "node-b"},
		{"pools annotations on another node", asA, "node-b",
			annotationsPatch(map[string]any{v1alpha1.PoolsInUseAnnotation: "p"}), msgOwnNode + "node-b"},
		{"node-b's token on node-a", asB, "node-a", nil, "on node node-b " + msgOwnNode + "node-a"},
		{"a token bound to no pod", asNone, "node-a", nil, msgNoNodeName},
		{"a token bound to no pod, annotations", asNone, "node-a",
			annotationsPatch(map[string]any{v1alpha1.PoolsInUseAnnotation: "p"}), msgNoNodeName},
		{"a foreign label added", asA, "node-a", labelsPatch(map[string]any{"gpu.example.com/model": "h100"}),
			msgLabels + "gpu.example.com/model"},
		{"a foreign label changed", asA, "node-a", labelsPatch(map[string]any{"team": "other"}), msgLabels + "team"},
		{"a foreign label removed", asA, "node-a", labelsPatch(map[string]any{"topology.kubernetes.io/zone": nil}),
			msgLabels + "topology.kubernetes.io/zone"},
		{"a NIC label together with a foreign one", asA, "node-a",
			labelsPatch(map[string]any{"nic.hwipam.io/present": "true", "team": "other"}), msgLabels + "team"},
		{"a look-alike label prefix", asA, "node-a", labelsPatch(map[string]any{"nic.hwipam.io.evil.com/x": "y"}),
			msgLabels + "nic.hwipam.io.evil.com/x"},
		{"a foreign annotation changed", asA, "node-a", annotationsPatch(map[string]any{"ops.example.com/owner": "me"}),
			msgAnnots + "ops.example.com/owner"},
		{"a foreign annotation added", asA, "node-a",
			annotationsPatch(map[string]any{"node.alpha.kubernetes.io/ttl": "0"}), msgAnnots + "node.alpha.kubernetes.io/ttl"},
		{"taints removed", asA, "node-a", map[string]any{"spec": map[string]any{"taints": nil}}, msgSpec},
		{"a taint added", asA, "node-a", map[string]any{"spec": map[string]any{"taints": []any{
			map[string]any{"key": "gpu", "value": "true", "effect": "NoSchedule"},
			map[string]any{"key": "evict", "effect": "NoExecute"}}}}, msgSpec},
		{"cordoned", asA, "node-a", map[string]any{"spec": map[string]any{"unschedulable": true}}, msgSpec},
		{"a finalizer", asA, "node-a", map[string]any{"metadata": map[string]any{"finalizers": []any{"x.io/hold"}}},
			msgFinalizers},
	}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			var err error
			if tc.patch == nil {
				err = applyNICLabels(ctx, tc.cfg, tc.node, map[string]string{"nic.hwipam.io/present": "true"})
			} else {
				err = mergePatchNode(ctx, tc.cfg, tc.node, tc.patch, false)
			}
			wantForbidden(t, err, tc.want)
		})
	}
	t.Run("refused by RBAC: status, delete, create", func(t *testing.T) {
		cs, err := kubernetes.NewForConfig(asA)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cs.CoreV1().Nodes().Patch(ctx, "node-a", "application/merge-patch+json",
			[]byte(`{"status":{"capacity":{"example.com/x":"1"}}}`), metav1.PatchOptions{}, "status")
		wantForbidden(t, err, `cannot patch resource "nodes/status"`)
		wantForbidden(t, cs.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{}), `cannot delete resource "nodes"`)
		_, err = cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-c"}}, metav1.CreateOptions{})
		wantForbidden(t, err, `cannot create resource "nodes"`)
	})

	t.Run("docs/rbac.md's commands", func(t *testing.T) {
		blocks := docBlocks(t, "docs/rbac.md", "sh")
		if len(blocks) != 2 {
			t.Fatalf("docs/rbac.md has %d sh blocks, want 2", len(blocks))
		}
		out, _ := runShell(t, e.kubeconfig, blocks[0])
		if got := strings.Fields(out); len(got) < 4 || !slices.Equal(got[:4], []string{"yes", "no", "yes", "no"}) ||
			!strings.Contains(out, "nodefeatures.nfd.k8s-sigs.io") {
			t.Errorf("the can-i commands printed:\n%s", out)
		}
		script := strings.NewReplacer("worker-1", "node-a", "worker-2", "node-b").Replace(blocks[1])
		out, errOut := runShell(t, e.kubeconfig, script)
		if !strings.Contains(out, "node/node-a labeled") || !strings.Contains(out, "node/node-a unlabeled") ||
			!strings.Contains(errOut, "on node node-a "+msgOwnNode+"node-b") || !strings.Contains(errOut, msgLabels+"example.com/x") {
			t.Errorf("the token commands printed:\n%s\n%s", out, errOut)
		}
	})

	// The real daemon, with node-a's token: it labels and annotates node-a.
	t.Run("the real ipam-node on its own node", func(t *testing.T) {
		pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail", Namespace: ns},
			Spec: v1alpha1.IPPoolSpec{Subnet: "10.20.0.0/24", PerNodeBlockSize: 16}}
		if err := e.c.Create(ctx, pool); err != nil {
			t.Fatal(err)
		}
		pool.Status.Allocations = []v1alpha1.Allocation{{NodeName: "node-a", StartIP: "10.20.0.1", EndIP: "10.20.0.16"}}
		if err := e.c.Status().Update(ctx, pool); err != nil {
			t.Fatal(err)
		}
		// The allocation's pod exists: the stale-allocation cleaner (list and watch pods) keeps it.
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if err := e.c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		logs, socket := startDaemon(t, e.tokenKubeconfig(t, tokA), "node-a", "--cleanup-interval", "300ms")
		ipam := ipamClient(t, socket)
		eventually(t, 30*time.Second, "an allocation from the rail pool", func() error {
			_, err := ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: &nodev1.IPAMParameters{
				Pools: []string{"rail"}, CniContainerid: "c1", CniIfname: "net1", PoolType: nodev1.PoolType_POOL_TYPE_IPPOOL,
				Metadata: &nodev1.IPAMMetadata{K8SPodName: "p1", K8SPodNamespace: "default", K8SPodUid: string(pod.UID)}}})
			return err
		})
		eventually(t, 30*time.Second, "node-a's NIC labels and pools annotations", func() error {
			var n corev1.Node
			if err := e.c.Get(ctx, client.ObjectKey{Name: "node-a"}, &n); err != nil {
				return err
			}
			if n.Labels["nic.hwipam.io/ibp24s0"] != "ib" || n.Labels["nic.hwipam.io/present"] != "true" {
				return fmt.Errorf("labels %v", n.Labels)
			}
			if n.Annotations[v1alpha1.PoolsInUseAnnotation] != "rail" || n.Annotations[v1alpha1.HeldAnnotation] == "" {
				return fmt.Errorf("annotations %v", n.Annotations)
			}
			return nil
		})
		time.Sleep(2 * time.Second) // several cleaner rounds
		if _, err := ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: &nodev1.IPAMParameters{
			Pools: []string{"rail"}, CniContainerid: "c1", CniIfname: "net1", PoolType: nodev1.PoolType_POOL_TYPE_IPPOOL}}); err != nil {
			t.Errorf("the allocation of a live pod is gone: %v", err)
		}
		if s := logs.String(); strings.Contains(strings.ToLower(s), "forbidden") {
			t.Errorf("ipam-node on its own node was refused something:\n%s", harness.LastLines(s, 20))
		}
	})
	// The real daemon told it runs on node-b, with node-a's token: refused, warned.
	t.Run("the real ipam-node with another node's name", func(t *testing.T) {
		logs, _ := startDaemon(t, e.tokenKubeconfig(t, tokA), "node-b")
		eventually(t, 30*time.Second, "ipam-node's warnings", func() error {
			s := logs.String()
			for _, want := range []string{"cannot publish the NIC labels", "cannot annotate this node",
				"on node node-a " + msgOwnNode + "node-b", "Check that --node-name (node-b) is that node"} {
				if !strings.Contains(s, want) {
					return fmt.Errorf("no %q in the log yet", want)
				}
			}
			return nil
		})
		var n corev1.Node
		if err := e.c.Get(ctx, client.ObjectKey{Name: "node-b"}, &n); err != nil {
			t.Fatal(err)
		}
		for k := range n.Labels {
			if strings.HasPrefix(k, "nic.hwipam.io/") {
				t.Errorf("node-b got label %s", k)
			}
		}
		if _, ok := n.Annotations[v1alpha1.HeldAnnotation]; ok {
			t.Errorf("node-b got the %s annotation", v1alpha1.HeldAnnotation)
		}
	})

	t.Run("nothing else changed on either node", func(t *testing.T) {
		for _, name := range []string{"node-a", "node-b"} {
			var n corev1.Node
			if err := e.c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
				t.Fatal(err)
			}
			if n.Labels["team"] != "ml" || n.Labels["topology.kubernetes.io/zone"] != "z1" || len(n.Labels) != 2+countPrefix(n.Labels, "nic.hwipam.io/") {
				t.Errorf("%s labels: %v", name, n.Labels)
			}
			if n.Annotations["ops.example.com/owner"] != "infra" {
				t.Errorf("%s annotations: %v", name, n.Annotations)
			}
			if b := before[name]; !equality.Semantic.DeepEqual(n.Spec, b.Spec) || len(n.Finalizers) != 0 {
				t.Errorf("%s spec/finalizers changed: %+v %v, was %+v", name, n.Spec, n.Finalizers, b.Spec)
			}
		}
	})
}

// TestNodeFeatureConfinedToItsNode: with --nic-labels=nodefeature the daemon may
// write only NodeFeature hwipam-<its node> in its namespace, labelled for its node,
// with nic.hwipam.io/ labels and no features.
func TestNodeFeatureConfinedToItsNode(t *testing.T) {
	e := startEnv(t)
	ctx := t.Context()
	for _, n := range []string{"node-a", "node-b"} {
		e.createNode(t, n)
	}
	asA, asNone := e.as(e.token(t, e.daemonPod(t, "node-a"))), e.as(e.token(t, nil))
	eventually(t, 30*time.Second, "the NodeFeature policy in force", func() error {
		err := applyNodeFeature(ctx, asA, ns, "hwipam-node-b", "node-b", map[string]string{"nic.hwipam.io/present": "true"}, nil, true)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "hwipam-node-own-nodefeature") {
			return nil
		}
		return fmt.Errorf("another node's NodeFeature is not refused by the policy yet: %w", err)
	})
	nic := map[string]string{"nic.hwipam.io/present": "true", "nic.hwipam.io/ibp24s0": "ib"}
	t.Run("its own NodeFeature", func(t *testing.T) {
		if err := applyNodeFeature(ctx, asA, ns, "hwipam-node-a", "node-a", nic, nil, false); err != nil {
			t.Fatal(err)
		}
	})
	// Another node's object, made by the admin, for the delete case.
	apply(t, e.c, nodeFeature(ns, "hwipam-node-b", "node-b", nic, nil))
	refused := []struct {
		name, namespace, object, node string
		cfg                           *rest.Config
		labels                        map[string]string
		features                      map[string]any
		want                          string
	}{
		{"another node's object", ns, "hwipam-node-b", "node-b", asA, nic, nil,
			"may write only the NodeFeature hwipam-node-a, not hwipam-node-b"},
		{"its object aimed at another node", ns, "hwipam-node-a", "node-b", asA, nic, nil,
			"must label its NodeFeature with exactly nfd.node.kubernetes.io/node-name=node-a"},
		{"a foreign label", ns, "hwipam-node-a", "node-a", asA,
			map[string]string{"nic.hwipam.io/present": "true", "feature.node.kubernetes.io/pci-15b3.present": "true"}, nil,
			"may publish only labels under nic.hwipam.io/ in its NodeFeature, not feature.node.kubernetes.io/pci-15b3.present"},
		{"features", ns, "hwipam-node-a", "node-a", asA, nic,
			map[string]any{"flags": map[string]any{"cpu.cpuid": map[string]any{"elements": map[string]any{"AVX": map[string]any{}}}}},
			"may not publish features in its NodeFeature"},
		{"another namespace", "default", "hwipam-node-a", "node-a", asA, nic, nil,
			`cannot patch resource "nodefeatures" in API group "nfd.k8s-sigs.io" in the namespace "default"`},
		{"a token bound to no pod", ns, "hwipam-node-a", "node-a", asNone, nic, nil, "this token carries no node name"},
	}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			wantForbidden(t, applyNodeFeature(ctx, tc.cfg, tc.namespace, tc.object, tc.node, tc.labels, tc.features, false), tc.want)
		})
	}
	t.Run("delete", func(t *testing.T) {
		c, err := client.New(asA, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		wantForbidden(t, c.Delete(ctx, nodeFeature(ns, "hwipam-node-b", "", nil, nil)), "not hwipam-node-b")
		if err := c.Delete(ctx, nodeFeature(ns, "hwipam-node-a", "", nil, nil)); err != nil {
			t.Fatalf("deleting its own NodeFeature: %v", err)
		}
	})
}

func whoami(t *testing.T, cfg *rest.Config) authenticationv1.UserInfo {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := r.Status.UserInfo.Username; u != "system:serviceaccount:"+ns+":"+nodeSA {
		t.Fatalf("the token authenticates as %s", u)
	}
	return r.Status.UserInfo
}

func labelsPatch(l map[string]any) map[string]any {
	return map[string]any{"metadata": map[string]any{"labels": l}}
}

func annotationsPatch(a map[string]any) map[string]any {
	return map[string]any{"metadata": map[string]any{"annotations": a}}
}

// applyNICLabels is the daemon's write of its NIC labels (pkg/ipamnode/niclabels.go):
// a server-side apply of the Node's labels with its field manager.
func applyNICLabels(ctx context.Context, cfg *rest.Config, node string, labels map[string]string) error {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	return c.Apply(ctx, corev1ac.Node(node).WithLabels(labels), client.FieldOwner(ipamnode.NICLabelFieldManager),
		client.ForceOwnership)
}

// nodeFeature is an NFD NodeFeature as the daemon writes it; node "" leaves out the
// node-name label.
func nodeFeature(namespace, name, node string, labels map[string]string, features map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(ipamnode.NodeFeatureGVK)
	u.SetNamespace(namespace)
	u.SetName(name)
	if node != "" {
		u.SetLabels(map[string]string{"nfd.node.kubernetes.io/node-name": node})
	}
	spec := map[string]any{}
	if labels != nil {
		l := map[string]any{}
		for k, v := range labels {
			l[k] = v
		}
		spec["labels"] = l
	}
	if features != nil {
		spec["features"] = features
	}
	u.Object["spec"] = spec
	return u
}

func applyNodeFeature(ctx context.Context, cfg *rest.Config, namespace, name, node string, labels map[string]string,
	features map[string]any, dryRun bool) error {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	opts := []client.ApplyOption{client.FieldOwner(ipamnode.NICLabelFieldManager), client.ForceOwnership}
	if dryRun {
		opts = append(opts, client.DryRunAll)
	}
	return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(nodeFeature(namespace, name, node, labels, features)), opts...)
}

// startDaemon runs the real ipam-node binary for node with kubeconfig, over the
// DGX-H100-like sysfs tree, and returns its log and socket.
func startDaemon(t *testing.T, kubeconfig, node string, extra ...string) (*logBuffer, string) {
	t.Helper()
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	socket := filepath.Join(state, "daemon.sock")
	args := []string{harness.BuildBinary(t, "./cmd/ipam-node"), "--node-name", node, "--kubeconfig", kubeconfig,
		"--ippools-namespace", ns, "--store-file", filepath.Join(state, "store"), "--bind-address", "unix://" + socket,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--cleanup-interval", "0",
		"--pools-in-use-interval", "200ms", "--sysfs-root", tree.Root, "--nic-rescan-interval", "1h",
		"--cni-skip-nv-ipam-binary-copy", "--cni-skip-nv-ipam-config-creation"}
	return start(t, append(args, extra...)...), socket
}

func ipamClient(t *testing.T, socket string) nodev1.IPAMServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return nodev1.NewIPAMServiceClient(conn)
}

func countPrefix(m map[string]string, prefix string) int {
	n := 0
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// docBlocks is every fenced block of the given language in a document.
func docBlocks(t *testing.T, doc, lang string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.RepoRoot(), doc))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, blk := range strings.Split(string(b), "```"+lang+"\n")[1:] {
		body, _, ok := strings.Cut(blk, "\n```")
		if !ok {
			t.Fatalf("%s: an unterminated %s block", doc, lang)
		}
		out = append(out, body)
	}
	return out
}

// runShell runs a script with bash in a scratch directory, the real kubectl first
// in PATH and kubeconfig as KUBECONFIG, and returns its stdout and stderr.
func runShell(t *testing.T, kubeconfig, script string) (string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig,
		"PATH="+filepath.Dir(nodeBin(t, "kubectl"))+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = &out, &errOut
	_ = cmd.Run() // the last command is meant to be refused
	return out.String(), errOut.String()
}
