package realnode_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/test/harness"
)

// The NFD path of docs/nfd.md on the real node: deploy/base's DaemonSet with
// --nic-labels=nodefeature (its pod's own token, deploy/'s Role and admission
// policy), the real nfd-master of hack/node/nfd running on the host, and the
// document's pool on the labels NFD puts on the Node. test/privilege's TestNFD
// runs the same binaries against a bare API server; this runs them on the node.
var _ = Describe("NIC labels through NFD's nfd-master", Label("nfd"), Ordered, func() {
	var nfdLog string

	BeforeAll(func(ctx SpecContext) {
		crds, err := harness.NFDCRDFile()
		Expect(err).NotTo(HaveOccurred())
		// NFD's CRDs stay installed, as cert-manager's do: nothing else reads them.
		_, err = node.Kubectl(ctx, "apply", "--server-side", "-f", crds)
		Expect(err).NotTo(HaveOccurred())
		_, err = node.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s",
			"crd/nodefeatures.nfd.k8s-sigs.io", "crd/nodefeaturerules.nfd.k8s-sigs.io")
		Expect(err).NotTo(HaveOccurred())

		// deploy/base with --nic-labels=nodefeature: the node's labels are NFD's to
		// write from here on. What the base's daemon wrote goes first, and again
		// (NFD's too) before deploy/base comes back.
		opts, err := node.BaseOptions()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			Expect(node.Undeploy(ctx)).To(Succeed())
			stripNFDMetadata(ctx)
			Expect(node.Redeploy(ctx)).To(Succeed())
		}, NodeTimeout(8*time.Minute))
		Expect(node.Undeploy(ctx)).To(Succeed())
		stripNodeMetadata(ctx)
		nfdLog = startNFDMaster()
		// no-webhook is deploy/base as it is; deployed under its own name so that
		// Redeploy still finds the suite's deploy/base.
		opts.Overlay = "deploy/overlays/no-webhook"
		opts.NodeArgs = append(opts.NodeArgs, "--nic-labels="+ipamnode.NICLabelsNodeFeature)
		Expect(node.Deploy(ctx, harness.RepoRoot(), opts)).To(Succeed())
	}, NodeTimeout(10*time.Minute))

	It("publishes the node's NodeFeature from the daemon's pod, within what RBAC and the admission policy allow", func(ctx SpecContext) {
		Eventually(ctx, func(g Gomega) {
			nf := &unstructured.Unstructured{}
			nf.SetGroupVersionKind(ipamnode.NodeFeatureGVK)
			g.Expect(cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "hwipam-" + node.NodeName}, nf)).To(Succeed())
			g.Expect(nf.GetLabels()).To(Equal(map[string]string{"nfd.node.kubernetes.io/node-name": node.NodeName}))
			labels, _, err := unstructured.NestedStringMap(nf.Object, "spec", "labels")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(labels).To(HaveKeyWithValue("nic.hwipam.io/ibp24s0", "ib"))
			g.Expect(labels).To(HaveKeyWithValue("nic.hwipam.io/ibp24s0.speed", "400000"))
		}).WithTimeout(60 * time.Second).WithPolling(time.Second).Should(Succeed())
		logs, err := node.Kubectl(ctx, "-n", "kube-system", "logs", "daemonset/hwipam-node")
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.ToLower(logs)).NotTo(ContainSubstring("forbidden"))
	})

	It("gets the labels onto the Node through nfd-master, not from the daemon", func(ctx SpecContext) {
		Eventually(ctx, func(g Gomega) {
			n, err := node.Clientset.CoreV1().Nodes().Get(ctx, node.NodeName, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(n.Labels).To(HaveKeyWithValue("nic.hwipam.io/ibp24s0", "ib"))
			g.Expect(n.Labels).To(HaveKeyWithValue("nic.hwipam.io/ibp24s0.speed", "400000"))
			g.Expect(n.Annotations).To(HaveKeyWithValue("nfd.node.kubernetes.io/feature-labels", ContainSubstring("nic.hwipam.io/ibp24s0")))
			for _, mf := range n.ManagedFields {
				g.Expect(mf.Manager).NotTo(Equal(ipamnode.NICLabelFieldManager), "the daemon owns fields of the Node: %s", mf.FieldsV1)
			}
		}).WithTimeout(60*time.Second).WithPolling(time.Second).Should(Succeed(), "nfd-master's log:\n%s", lastLogLines(nfdLog))
	})

	It("gives docs/nfd.md's pool on those labels a block on the node, and a pod an address from it", func(ctx SpecContext) {
		var pool string
		for i, doc := range docYAML(filepath.Join(harness.RepoRoot(), "docs", "nfd.md")) {
			var meta metav1.PartialObjectMetadata
			Expect(yaml.Unmarshal([]byte(doc), &meta)).To(Succeed())
			if meta.Kind != "IPPool" || meta.Name != "rail-ibp24s0" {
				continue
			}
			f := filepath.Join(node.Dir, "nfd-doc-pool.yaml")
			Expect(os.WriteFile(f, []byte(doc), 0o644)).To(Succeed(), "document %d", i)
			_, err := node.Kubectl(ctx, "apply", "-f", f)
			Expect(err).NotTo(HaveOccurred())
			pool = meta.Name
			DeferCleanup(func(ctx SpecContext) {
				_, err := node.Kubectl(ctx, "delete", "--ignore-not-found", "-f", f)
				Expect(err).NotTo(HaveOccurred())
			})
		}
		Expect(pool).NotTo(BeEmpty(), "docs/nfd.md has no IPPool rail-ibp24s0")
		Eventually(ctx, func(g Gomega) {
			var p v1alpha1.IPPool
			g.Expect(cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: pool}, &p)).To(Succeed())
			g.Expect(p.Status.Allocations).To(ContainElement(HaveField("NodeName", node.NodeName)))
		}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())

		createNAD(ctx, "nfd-rail", macvlanConfig("nfd-rail", pool, `"poolType": "ippool"`))
		DeferCleanup(func(ctx SpecContext) {
			nads, err := node.NADClient()
			Expect(err).NotTo(HaveOccurred())
			err = nads.K8sCniCncfIoV1().NetworkAttachmentDefinitions(ns).Delete(ctx, "nfd-rail", metav1.DeleteOptions{})
			if !apierrors.IsNotFound(err) {
				Expect(err).NotTo(HaveOccurred())
			}
		})
		createPod(ctx, "nfd-pod", "nfd-rail")
		ip := networkIPs(waitReady(ctx, "nfd-pod"))["nfd-rail"]
		start, end := block(ctx, pool)
		Expect(ip.Compare(start) >= 0 && ip.Compare(end) <= 0).To(BeTrue(), "%s outside the node's block %s-%s", ip, start, end)
	})
})

// startNFDMaster runs the real nfd-master (hack/node/nfd, built into the node's bin
// directory) on the host against the node's API server, with its defaults and no
// config file, until the enclosing node ends. It returns the path of its log.
func startNFDMaster() string {
	stop, err := node.StartHostProcess("nfd-master", filepath.Join(node.Bin, "nfd-master"),
		[]string{"-kubeconfig", node.Kubeconfig, "-metrics", "0", "-grpc-health", "0",
			"-config", filepath.Join(node.Dir, "nfd-master-none.conf"), "-resync-period", "10s"},
		"NODE_NAME="+node.NodeName, "KUBERNETES_NAMESPACE=kube-system")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(stop()).To(Succeed()) })
	return filepath.Join(node.Dir, "logs", "nfd-master.log")
}

// stripNFDMetadata removes the nic.hwipam.io/ labels and the pool annotations (as
// stripNodeMetadata does) and NFD's nfd.node.kubernetes.io/ annotations, once the
// daemon that published them through NFD is gone: the NodeFeature goes, then
// nfd-master's bookkeeping, so that deploy/base's daemon finds the node as it left it.
func stripNFDMetadata(ctx context.Context) {
	_, err := node.Kubectl(ctx, "-n", "kube-system", "delete", "--ignore-not-found", "nodefeatures.nfd.k8s-sigs.io", "hwipam-"+node.NodeName)
	Expect(err).NotTo(HaveOccurred())
	stripNodeMetadata(ctx)
	n, err := node.Clientset.CoreV1().Nodes().Get(ctx, node.NodeName, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	var annotations []string
	for k := range n.Annotations {
		if strings.HasPrefix(k, "nfd.node.kubernetes.io/") {
			annotations = append(annotations, k+"-")
		}
	}
	if len(annotations) > 0 {
		_, err = node.Kubectl(ctx, append([]string{"annotate", "node", node.NodeName}, annotations...)...)
		Expect(err).NotTo(HaveOccurred())
	}
}

// lastLogLines is the tail of a log file, for a failure message.
func lastLogLines(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return harness.LastLines(string(data), 30)
}
