package privilege

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/test/harness"
)

// docYAML is every fenced yaml block of a document of the repository, decoded.
func docYAML(t *testing.T, doc string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, body := range docBlocks(t, doc, "yaml") {
		objs = append(objs, decodeYAML(t, body)...)
	}
	return objs
}

func byKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// TestNFD runs the NFD path of docs/nfd.md: the real ipam-node (a pod-bound token,
// deploy/'s RBAC and policies) publishes its NIC labels as a NodeFeature, the real
// nfd-master turns it into Node labels, and the real ipam-controller gives the
// document's pool on those labels a block on the node. The document's
// NodeFeatureRule, fed a NodeFeature shaped like nfd-worker's, gives the network
// operator's pci-15b3.present label and its pool a block. Every YAML block of
// docs/nfd.md is applied.
func TestNFD(t *testing.T) {
	e := startEnv(t)
	ctx := t.Context()
	const node, other = "dgx-01", "cpu-01"
	e.createNode(t, node)
	e.createNode(t, other)
	doc := docYAML(t, "docs/nfd.md")
	docFeatures, pools, rules := byKind(doc, "NodeFeature"), byKind(doc, "IPPool"), byKind(doc, "NodeFeatureRule")
	if len(docFeatures) != 1 || len(pools) != 2 || len(rules) != 1 || len(doc) != 4 {
		t.Fatalf("docs/nfd.md: want a NodeFeature, two IPPools and a NodeFeatureRule, got %d objects", len(doc))
	}

	e.createNode(t, "control-01")
	startNFDMaster(t, e, "control-01")
	start(t, harness.BuildBinary(t, "./cmd/ipam-controller"), "--kubeconfig", e.kubeconfig, "--ippools-namespace", ns,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	startDaemon(t, e.tokenKubeconfig(t, e.token(t, e.daemonPod(t, node))), node,
		"--nic-labels", ipamnode.NICLabelsNodeFeature, "--nodefeature-namespace", ns)

	t.Run("ipam-node's NodeFeature is the document's", func(t *testing.T) {
		want := docFeatures[0]
		eventually(t, 60*time.Second, "the NodeFeature", func() error {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(ipamnode.NodeFeatureGVK)
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(want), got); err != nil {
				return err
			}
			if !maps.Equal(got.GetLabels(), want.GetLabels()) {
				return fmt.Errorf("labels %v, the document says %v", got.GetLabels(), want.GetLabels())
			}
			gotLabels, _, _ := unstructured.NestedStringMap(got.Object, "spec", "labels")
			wantLabels, _, _ := unstructured.NestedStringMap(want.Object, "spec", "labels")
			for k, v := range wantLabels {
				if gotLabels[k] != v {
					return fmt.Errorf("spec.labels[%s] = %q, the document says %q", k, gotLabels[k], v)
				}
			}
			if _, has, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", "features"); has {
				return fmt.Errorf("the NodeFeature has features: %v", got.Object["spec"])
			}
			return nil
		})
		apply(t, e.c, want)
	})
	t.Run("nfd-master labels the node", func(t *testing.T) {
		eventually(t, 60*time.Second, "the NIC labels on the Node through NFD", func() error {
			var n corev1.Node
			if err := e.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
				return err
			}
			if n.Labels["nic.hwipam.io/ibp24s0"] != "ib" || n.Labels["nic.hwipam.io/ibp24s0.model"] != "ConnectX-7" {
				return fmt.Errorf("labels %v", n.Labels)
			}
			if a := n.Annotations["nfd.node.kubernetes.io/feature-labels"]; !strings.Contains(a, "nic.hwipam.io/ibp24s0") {
				return fmt.Errorf("NFD's feature-labels annotation is %q", a)
			}
			// NFD wrote them, not ipam-node (which in this mode only annotates).
			for _, mf := range n.ManagedFields {
				if mf.Manager == ipamnode.NICLabelFieldManager {
					return fmt.Errorf("ipam-node's field manager owns fields of the Node: %s", mf.FieldsV1)
				}
			}
			return nil
		})
	})
	apply(t, e.c, rules...)
	apply(t, e.c, pools...)
	t.Run("the pool on NFD's nic.hwipam.io labels gets a block on the node", func(t *testing.T) {
		waitBlocks(t, e.c, "rail-ibp24s0", node)
	})
	t.Run("the NodeFeatureRule gives pci-15b3.present and its pool a block", func(t *testing.T) {
		// What nfd-worker's pci source publishes for the node (one ConnectX-7 function).
		apply(t, e.c, workerNodeFeature(node))
		eventually(t, 60*time.Second, "feature.node.kubernetes.io/pci-15b3.present on the node", func() error {
			var n corev1.Node
			if err := e.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
				return err
			}
			if v := n.Labels["feature.node.kubernetes.io/pci-15b3.present"]; v != "true" {
				return fmt.Errorf("labels %v", n.Labels)
			}
			return nil
		})
		waitBlocks(t, e.c, "nvidia-nics", node)
	})
	t.Run("the node without NICs has none of it", func(t *testing.T) {
		var n corev1.Node
		if err := e.c.Get(ctx, client.ObjectKey{Name: other}, &n); err != nil {
			t.Fatal(err)
		}
		for k := range n.Labels {
			if strings.HasPrefix(k, "nic.hwipam.io/") || strings.HasPrefix(k, "feature.node.kubernetes.io/") {
				t.Errorf("%s has label %s", other, k)
			}
		}
	})
}

// startNFDMaster runs the real nfd-master with its defaults (no config file) and
// extra flags until the (sub)test ends. It annotates the Node it runs on at start.
func startNFDMaster(t *testing.T, e *env, onNode string, flags ...string) *logBuffer {
	t.Helper()
	args := append([]string{nodeBin(t, "nfd-master"), "-kubeconfig", e.kubeconfig, "-metrics", "0", "-grpc-health", "0",
		"-config", filepath.Join(t.TempDir(), "none.conf"), "-resync-period", "10s"}, flags...)
	return startWithEnv(t, []string{"NODE_NAME=" + onNode, "KUBERNETES_NAMESPACE=" + ns}, args...)
}

// TestNFDLabelNamespaces: NFD's -deny-label-ns drops the nic.hwipam.io labels with
// an error in its log, and -extra-label-ns lets them through again (docs/nfd.md).
func TestNFDLabelNamespaces(t *testing.T) {
	e := startEnv(t)
	const node = "dgx-02"
	e.createNode(t, "control-01")
	e.createNode(t, node)
	apply(t, e.c, nodeFeature(ns, "hwipam-"+node, node, map[string]string{"nic.hwipam.io/present": "true"}, nil))
	label := func() (string, error) {
		var n corev1.Node
		err := e.c.Get(t.Context(), client.ObjectKey{Name: node}, &n)
		return n.Labels["nic.hwipam.io/present"], err
	}
	t.Run("-deny-label-ns=*.hwipam.io", func(t *testing.T) {
		logs := startNFDMaster(t, e, "control-01", "-deny-label-ns=*.hwipam.io")
		eventually(t, 60*time.Second, "nfd-master refusing the label", func() error {
			if s := logs.String(); !strings.Contains(s, `ignoring label`) || !strings.Contains(s, `namespace \"nic.hwipam.io\" is not allowed`) {
				return fmt.Errorf("not in nfd-master's log yet")
			}
			return nil
		})
		if v, err := label(); err != nil || v != "" {
			t.Fatalf("the node has nic.hwipam.io/present=%q (%v)", v, err)
		}
	})
	t.Run("and -extra-label-ns=nic.hwipam.io", func(t *testing.T) {
		startNFDMaster(t, e, "control-01", "-deny-label-ns=*.hwipam.io", "-extra-label-ns=nic.hwipam.io")
		eventually(t, 60*time.Second, "the label on the node", func() error {
			if v, err := label(); err != nil || v != "true" {
				return fmt.Errorf("nic.hwipam.io/present=%q (%w)", v, err)
			}
			return nil
		})
	})
}

// waitBlocks waits until pool's status lists blocks for exactly nodes.
func waitBlocks(t *testing.T, c client.Client, pool string, nodes ...string) {
	t.Helper()
	slices.Sort(nodes)
	eventually(t, 60*time.Second, "blocks of pool "+pool, func() error {
		var p v1alpha1.IPPool
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: pool}, &p); err != nil {
			return err
		}
		var got []string
		for _, a := range p.Status.Allocations {
			got = append(got, a.NodeName)
		}
		slices.Sort(got)
		if !slices.Equal(got, nodes) {
			return fmt.Errorf("blocks on %v, want %v", got, nodes)
		}
		return nil
	})
}

// workerNodeFeature is a NodeFeature as nfd-worker publishes it (named after the
// node), holding one pci.device instance: a ConnectX-7 InfiniBand function.
func workerNodeFeature(node string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"features": map[string]any{
			"flags":      map[string]any{},
			"attributes": map[string]any{},
			"instances": map[string]any{"pci.device": map[string]any{"elements": []any{
				map[string]any{"attributes": map[string]any{"vendor": "15b3", "device": "1021", "class": "0207"}},
			}}},
		}},
	}}
	u.SetGroupVersionKind(ipamnode.NodeFeatureGVK)
	u.SetNamespace(ns)
	u.SetName(node)
	u.SetLabels(map[string]string{"nfd.node.kubernetes.io/node-name": node})
	return u
}
