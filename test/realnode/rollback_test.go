package realnode_test

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/test/harness"
)

// exportPod is the one-shot export pod of docs/migration.md, for this node:
// its nodeName, the image the node runs and the node's state directory as the
// hostPath; the command and the mount are the document's.
func exportPod(image string) *corev1.Pod {
	for _, doc := range docYAML(filepath.Join(harness.RepoRoot(), "docs", "migration.md")) {
		var pod corev1.Pod
		Expect(yaml.UnmarshalStrict([]byte(doc), &pod)).To(Succeed(), doc)
		if pod.Kind != "Pod" {
			continue
		}
		pod.Spec.NodeName = node.NodeName
		pod.Spec.Containers[0].Image = image
		Expect(pod.Spec.Volumes).To(HaveLen(1))
		Expect(pod.Spec.Volumes[0].HostPath.Path).To(Equal("/var/lib/cni/nv-ipam"))
		pod.Spec.Volumes[0].HostPath.Path = node.StateDir
		return &pod
	}
	Fail("docs/migration.md has no export Pod")
	return nil
}

// nvStore is nv-ipam's JSON store as the spec reads it: enough to check the
// checksum (FNV-32a of this encoding with the checksum 0, computed here with the
// standard library) and the entries.
type nvStore struct {
	Version  int    `json:"version"`
	Checksum uint32 `json:"checksum"`
	Pools    map[string]*struct {
		Name    string `json:"name"`
		Entries map[string]*struct {
			ContainerID   string `json:"container_id"`
			InterfaceName string `json:"interface_name"`
			IPAddress     string `json:"ip_address"`
			Metadata      struct {
				CreateTime         string `json:"create_time"`
				PodUUID            string `json:"pod_uuid"`
				PodName            string `json:"pod_name"`
				PodNamespace       string `json:"pod_namespace"`
				DeviceID           string `json:"device_id"`
				PoolConfigSnapshot string `json:"pool_config_snapshot"`
			} `json:"metadata"`
		} `json:"entries"`
		LastPoolConfig string `json:"last_pool_config"`
		LastReservedIP string `json:"last_reserved_ip"`
	} `json:"pools"`
}

// The way back (docs/migration.md): hwipam's daemon stopped on a node whose pods
// keep running, the store exported in place in nv-ipam's format by the
// document's pod, then hwipam started again over it: it imports the export, as
// nv-ipam's daemon would read it. Every pod keeps its address throughout, and
// nothing is handed out twice afterwards.
var _ = Describe("the rollback's store export on a node with running pods", Label("rollback"), Ordered, func() {
	It("goes hwipam → nv-ipam's store → hwipam, and every pod keeps its address", func(ctx SpecContext) {
		pods := map[string][]string{"rb-1": {"e2e-a", "e2e-b"}, "rb-2": {"e2e-a"}, "rb-3": {"e2e-b"}}
		want := map[string]string{} // "pod network" → address
		for name, nets := range pods {
			createPod(ctx, name, nets...)
		}
		for name := range pods {
			for net, ip := range networkIPs(waitReady(ctx, name)) {
				want[name+" "+net] = ip.String()
			}
		}
		before := allocations(ctx)
		image := ipamNodePod(ctx).Spec.Containers[0].Image

		// 1. hwipam's daemon leaves the node; the pods stay.
		stopNodeDaemon(ctx)
		DeferCleanup(func(ctx SpecContext) {
			Expect(node.Redeploy(ctx)).To(Succeed())
			Expect(node.WaitRollout(ctx, 2*time.Minute)).To(Succeed())
		}, NodeTimeout(3*time.Minute))

		// 2. The export, as the document's pod runs it.
		logs, ok := runExportPod(ctx, image)
		Expect(ok).To(BeTrue(), "the export failed:\n%s", logs)
		Expect(logs).To(ContainSubstring(fmt.Sprintf("exported %d allocation(s)", len(before))))

		// The store is nv-ipam's JSON now, its checksum right, every address in it.
		exported, err := os.ReadFile(filepath.Join(node.StateDir, "store"))
		Expect(err).NotTo(HaveOccurred())
		var st nvStore
		Expect(json.Unmarshal(exported, &st)).To(Succeed(), string(exported))
		Expect(st.Version).To(Equal(1))
		sum := st.Checksum
		st.Checksum = 0
		zeroed, err := json.Marshal(&st)
		Expect(err).NotTo(HaveOccurred())
		h := fnv.New32a()
		h.Write(zeroed)
		Expect(sum).To(Equal(h.Sum32()), "nv-ipam's checksum of the export")
		var inStore []string
		for key, p := range st.Pools {
			for _, e := range p.Entries {
				inStore = append(inStore, fmt.Sprintf("%s %s %s/%s", key, e.IPAddress, e.Metadata.PodNamespace, e.Metadata.PodName))
			}
		}
		slices.Sort(inStore)
		Expect(inStore).To(Equal(before))
		_, err = os.Stat(filepath.Join(node.StateDir, "store.hwipam"))
		Expect(err).NotTo(HaveOccurred(), "the hwipam store kept beside the export")

		// 3. hwipam again, over the nv-ipam store.
		Expect(node.Redeploy(ctx)).To(Succeed())
		Expect(node.WaitRollout(ctx, 2*time.Minute)).To(Succeed())
		Expect(allocations(ctx)).To(Equal(before))
		backup, err := os.ReadFile(filepath.Join(node.StateDir, "store.nv-ipam.json"))
		Expect(err).NotTo(HaveOccurred())
		Expect(backup).To(Equal(exported), "the import kept the export as its backup")
		for key, ip := range want {
			name, _, _ := strings.Cut(key, " ")
			out, err := node.Kubectl(ctx, "exec", name, "--", "ip", "-4", "-o", "addr", "show")
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(ContainSubstring(ip+"/"), "%s lost its address", key)
		}
		// A new pod gets an address none of them holds.
		createPod(ctx, "rb-new", "e2e-a", "e2e-b")
		for net, ip := range networkIPs(waitReady(ctx, "rb-new")) {
			for key, held := range want {
				Expect(ip.String()).NotTo(Equal(held), "rb-new's %s address is %s's", net, key)
			}
		}
	})
})

// stopNodeDaemon deletes hwipam-node's DaemonSet (its pods go, the pods they
// served stay) and waits until its pods are gone: step 1 of the rollback.
func stopNodeDaemon(ctx SpecContext) {
	GinkgoHelper()
	_, err := node.Kubectl(ctx, "-n", "kube-system", "delete", "daemonset/hwipam-node", "--wait=true", "--timeout=2m")
	Expect(err).NotTo(HaveOccurred())
	Eventually(ctx, func() ([]corev1.Pod, error) {
		l, err := node.Clientset.CoreV1().Pods("kube-system").List(ctx,
			metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=hwipam-node"})
		return l.Items, err
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(BeEmpty())
}

// runExportPod runs docs/migration.md's export pod with the image until it
// ends, and returns its log and whether it succeeded; the pod is deleted.
func runExportPod(ctx SpecContext, image string) (string, bool) {
	GinkgoHelper()
	pod := exportPod(image)
	_, err := node.Clientset.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	defer func() {
		grace := int64(0)
		_ = node.Clientset.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
		Eventually(ctx, func() bool {
			_, err := node.Clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}).WithTimeout(time.Minute).Should(BeTrue(), "export pod %s is not gone", pod.Name)
	}()
	var phase corev1.PodPhase
	Eventually(ctx, func(g Gomega) {
		p, err := node.Clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		phase = p.Status.Phase
		g.Expect(phase).To(BeElementOf(corev1.PodSucceeded, corev1.PodFailed), "%s", podEventsIn(ctx, pod.Namespace, pod.Name))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	logs, err := node.Kubectl(ctx, "-n", pod.Namespace, "logs", pod.Name)
	Expect(err).NotTo(HaveOccurred())
	return logs, phase == corev1.PodSucceeded
}

// docKubectl returns the kubectl commands (their arguments) of the sh blocks of
// a document that mention what anywhere.
func docKubectl(path, what string) [][]string {
	GinkgoHelper()
	md, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	var out, block [][]string
	in, mentions := false, false
	for _, line := range strings.Split(string(md), "\n") {
		t := strings.TrimSpace(line)
		switch {
		case t == "```sh":
			in, mentions, block = true, false, nil
		case in && t == "```":
			in = false
			if mentions {
				out = append(out, block...)
			}
		case in:
			mentions = mentions || strings.Contains(t, what)
			if strings.HasPrefix(t, "kubectl ") {
				block = append(block, strings.Fields(strings.TrimPrefix(t, "kubectl ")))
			}
		}
	}
	return out
}
