package realnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/test/harness"
	"github.com/hwipam/hwipam/test/ociimage"
	"github.com/hwipam/hwipam/test/realnode"
)

// The suite runs on one real node (kubelet, containerd, Multus) with hwipam deployed
// from deploy/base. Labels select a subset, e.g.
//
//	go test ./test/realnode -ginkgo.label-filter='pods || malformed'
func TestRealNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the real-node suite runs kubelet and containerd and needs root")
	}
	RegisterFailHandler(Fail)
	RunSpecs(t, "real node")
}

const ns = "default"

var (
	node     *realnode.Cluster
	cl       client.Client
	nodeInfo infov1.NodeInfoServiceClient
	// failed keeps the run directory (every component's log) for a look afterwards.
	failed bool
	// master is the host link the macvlan networks sit on.
	master string
)

var _ = BeforeSuite(func(ctx SpecContext) {
	var err error
	start := time.Now()
	node, err = realnode.Start(ctx, realnode.Options{NodeName: "e2e-node",
		Progress: func(f string, a ...any) { fmt.Fprintf(GinkgoWriter, f+"\n", a...) }})
	Expect(err).NotTo(HaveOccurred())
	failed = true // until the suite's setup has finished
	DeferCleanup(func() {
		u := node.Usage()
		var rss int64
		var cpu float64
		for name, b := range u.RSSBytes {
			rss += b
			fmt.Fprintf(GinkgoWriter, "%-24s RSS %4d MiB CPU %6.1fs\n", name, b>>20, u.CPUSeconds[name])
			cpu += u.CPUSeconds[name]
		}
		fmt.Fprintf(GinkgoWriter, "node total: RSS %d MiB, CPU %.1fs\n", rss>>20, cpu)
		if failed {
			fmt.Fprintf(GinkgoWriter, "kept the run directory: component logs in %s/logs, container logs in %s/logs/pods\n", node.Dir, node.Dir)
		}
		Expect(node.Stop(failed)).To(Succeed())
	})
	image, err := node.BuildImage(ctx, harness.RepoRoot(), "e2e")
	Expect(err).NotTo(HaveOccurred())
	master = node.Prefix + "m0"
	Expect(node.AddVeth(master, node.Prefix+"m0p")).To(Succeed())
	// NIC discovery reads a DGX-H100-like sysfs tree: the node gets rail labels.
	tree, err := fakesysfs.DGXH100(filepath.Join(node.Dir, "sysfs"))
	Expect(err).NotTo(HaveOccurred())
	Expect(node.Deploy(ctx, harness.RepoRoot(), realnode.DeployOptions{Image: image,
		HostPaths: []string{tree.Root}, NodeArgs: []string{"--sysfs-root=" + tree.Root}})).To(Succeed())
	cl, err = node.Client()
	Expect(err).NotTo(HaveOccurred())
	conn, err := grpc.NewClient("unix://"+filepath.Join(node.StateDir, "daemon.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(conn.Close)
	nodeInfo = infov1.NewNodeInfoServiceClient(conn)

	for _, p := range []struct{ name, subnet string }{{"e2e-a", "10.31.0.0/24"}, {"e2e-b", "10.32.0.0/24"}} {
		Expect(cl.Create(ctx, &v1alpha1.IPPool{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "kube-system"},
			Spec:       v1alpha1.IPPoolSpec{Subnet: p.subnet, PerNodeBlockSize: 32},
		})).To(Succeed())
		createNAD(ctx, p.name, macvlanConfig(p.name, p.name, `"poolType": "ippool"`))
	}
	fmt.Fprintf(GinkgoWriter, "node up, hwipam deployed, networks created in %.1fs\n", time.Since(start).Seconds())
	failed = false
}, NodeTimeout(15*time.Minute))

var _ = AfterEach(func() {
	if CurrentSpecReport().Failed() {
		failed = true
	}
})

func macvlanConfig(name, pool, extra string) string {
	return fmt.Sprintf(`{"cniVersion": "1.0.0", "name": %q, "type": "macvlan", "master": %q, "mode": "bridge",
  "ipam": {"type": "nv-ipam", "poolName": %q, "confDir": %q, %s}}`,
		name, master, pool, filepath.Join(node.CNIConfDir, "nv-ipam.d"), extra)
}

// createNAD creates a NetworkAttachmentDefinition through the typed client.
func createNAD(ctx context.Context, name, config string) {
	nads, err := node.NADClient()
	Expect(err).NotTo(HaveOccurred())
	_, err = nads.K8sCniCncfIoV1().NetworkAttachmentDefinitions(ns).Create(ctx, &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: config},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
}

// createPod starts a busybox pod on the given networks and removes it when the spec ends.
func createPod(ctx context.Context, name string, networks ...string) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Annotations: map[string]string{nadv1.NetworkAttachmentAnnot: strings.Join(networks, ",")}},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{{Name: "app", Image: node.BusyboxImage(), Command: []string{"sleep", "1000000"}}},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
	_, err := node.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func(ctx SpecContext) { deletePod(ctx, name) })
}

// deletePod deletes a pod gracefully (a grace period of 0 would remove the object at
// once, before kubelet has torn the sandbox down) and waits until it is gone: then
// kubelet has run CNI DEL.
func deletePod(ctx context.Context, name string) {
	grace := int64(1)
	err := node.Clientset.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	if apierrors.IsNotFound(err) {
		return
	}
	Expect(err).NotTo(HaveOccurred())
	Eventually(ctx, func() bool {
		_, err := node.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}).WithTimeout(60*time.Second).Should(BeTrue(), "pod %s is not gone", name)
}

func waitReady(ctx context.Context, name string) *corev1.Pod {
	var pod *corev1.Pod
	Eventually(ctx, func(g Gomega) {
		var err error
		pod, err = node.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pod.Status.Conditions).To(ContainElement(And(
			HaveField("Type", corev1.PodReady), HaveField("Status", corev1.ConditionTrue))), "pod %s: %s", name, podEvents(ctx, name))
	}).WithTimeout(90 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	return pod
}

func podEvents(ctx context.Context, name string) string { return podEventsIn(ctx, ns, name) }

// networkIPs reads Multus' network-status annotation: network name -> address.
func networkIPs(pod *corev1.Pod) map[string]netip.Addr {
	var status []nadv1.NetworkStatus
	Expect(json.Unmarshal([]byte(pod.Annotations[nadv1.NetworkStatusAnnot]), &status)).To(Succeed(),
		"pod %s has no readable %s annotation", pod.Name, nadv1.NetworkStatusAnnot)
	ips := map[string]netip.Addr{}
	for _, s := range status {
		if len(s.IPs) > 0 && s.Name != "podnet" {
			ips[strings.TrimPrefix(s.Name, ns+"/")] = netip.MustParseAddr(s.IPs[0])
		}
	}
	return ips
}

// block returns the node's block of a pool from the pool's status.
func block(ctx context.Context, pool string) (netip.Addr, netip.Addr) {
	var p v1alpha1.IPPool
	Expect(cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: pool}, &p)).To(Succeed())
	for _, a := range p.Status.Allocations {
		if a.NodeName == node.NodeName {
			return netip.MustParseAddr(a.StartIP), netip.MustParseAddr(a.EndIP)
		}
	}
	Fail(fmt.Sprintf("pool %s has no block for node %s: %+v", pool, node.NodeName, p.Status.Allocations))
	return netip.Addr{}, netip.Addr{}
}

// allocations lists the node daemon's allocations as "pool ip pod" lines, sorted.
func allocations(ctx context.Context) []string { return allocationsFrom(ctx, nodeInfo) }

// allocationsFrom is allocations of the daemon behind info.
func allocationsFrom(ctx context.Context, info infov1.NodeInfoServiceClient) []string {
	var out []string
	Eventually(ctx, func(g Gomega) {
		resp, err := info.ListAllocations(ctx, &infov1.ListAllocationsRequest{})
		g.Expect(err).NotTo(HaveOccurred())
		out = out[:0]
		for _, a := range resp.GetAllocations() {
			out = append(out, fmt.Sprintf("%s %s %s/%s", a.GetPool(), a.GetIp(), a.GetPodNamespace(), a.GetPodName()))
		}
	}).WithTimeout(60 * time.Second).Should(Succeed())
	slices.Sort(out)
	return out
}

func ipamNodePod(ctx context.Context) *corev1.Pod {
	return livePod(ctx, "kube-system", "app.kubernetes.io/name=hwipam-node")
}

// livePod is the one pod in namespace matching selector that is not being deleted.
func livePod(ctx context.Context, namespace, selector string) *corev1.Pod {
	pods, err := node.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	Expect(err).NotTo(HaveOccurred())
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	Expect(live).To(HaveLen(1))
	return &live[0]
}

var _ = Describe("deploy/base on a real node", Label("deploy"), func() {
	It("uses an image index with the Dockerfile's layout, built by make image, and the node pulled its own platform", func(ctx SpecContext) {
		l, err := ociimage.Read(filepath.Join(node.Dir, "image", "hwipam-image.tar"))
		Expect(err).NotTo(HaveOccurred())
		var own *ociimage.Image
		var platforms []string
		for i := range l.Images {
			platforms = append(platforms, l.Images[i].Platform.String())
			if l.Images[i].Platform == (ociimage.Platform{OS: "linux", Architecture: runtime.GOARCH}) {
				own = &l.Images[i]
			}
		}
		Expect(platforms).To(ConsistOf("linux/amd64", "linux/arm64"))
		Expect(own).NotTo(BeNil())
		for _, bin := range []string{"ipam-controller", "ipam-node", "nv-ipam", "ipamctl"} {
			Expect(own.Files).To(HaveKeyWithValue("/"+bin, HaveField("Mode", BeEquivalentTo(0o755))), "/%s in the image", bin)
		}
		Expect(own.Files).To(HaveKey("/etc/passwd"))
		Expect(own.Files).To(HaveKeyWithValue("/tmp", HaveField("Mode", BeEquivalentTo(0o1777))))
		Expect(own.Config.OS).To(Equal("linux"))
		Expect(own.Config.Architecture).To(Equal(runtime.GOARCH))
		Expect(own.Config.Config.User).To(Equal("65532:65532"))
		// containerd pulled the index by its tag and unpacked the node's platform
		// (what the running ipam-node container was made from).
		out, err := execCtr(ctx, "-n", "k8s.io", "images", "ls")
		Expect(err).NotTo(HaveOccurred())
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, ipamNodePod(ctx).Spec.Containers[0].Image+" ") {
				line = l
			}
		}
		Expect(line).To(ContainSubstring("application/vnd.oci.image.index.v1+json"), out)
		Expect(line).To(ContainSubstring("linux/amd64"), out)
		Expect(line).To(ContainSubstring("linux/arm64"), out)
		// The tarball itself loads as docs/development.md says (ctr images import),
		// in a namespace of its own, removed again.
		tarball := filepath.Join(node.Dir, "image", "hwipam-image.tar")
		out, err = execCtr(ctx, "-n", "hwipam-import-check", "images", "import", "--all-platforms", tarball)
		Expect(err).NotTo(HaveOccurred(), out)
		DeferCleanup(func(ctx SpecContext) {
			_, _ = execCtr(ctx, "-n", "hwipam-import-check", "images", "rm", "hwipam:e2e")
			_, _ = execCtr(ctx, "namespaces", "rm", "hwipam-import-check")
		})
		out, err = execCtr(ctx, "-n", "hwipam-import-check", "images", "ls")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(And(ContainSubstring("hwipam:e2e"), ContainSubstring("linux/amd64"), ContainSubstring("linux/arm64")))
	})

	It("installs the plugin and nv-ipam.conf into the host's CNI directories", func() {
		st, err := os.Stat(filepath.Join(node.CNIBinDir, "nv-ipam"))
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Mode().Perm() & 0o111).NotTo(BeZero())
		conf, err := os.ReadFile(filepath.Join(node.CNIConfDir, "nv-ipam.d", "nv-ipam.conf"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(conf)).To(ContainSubstring(filepath.Join(node.StateDir, "daemon.sock")))
	})

	// Specs run in random order, and the restart specs kill ipam-node on purpose: a
	// restart counts against the deployment unless it followed such a kill (exit 137).
	It("runs the controller and the node daemon ready, probes passing, not crash-looping", func(ctx SpecContext) {
		for _, app := range []string{"hwipam-controller", "hwipam-node"} {
			pods, err := node.Clientset.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
			Expect(err).NotTo(HaveOccurred())
			Expect(pods.Items).NotTo(BeEmpty(), app)
			for _, p := range pods.Items {
				if p.DeletionTimestamp != nil {
					continue
				}
				events := podEventsIn(ctx, "kube-system", p.Name)
				// (A readiness probe refused before the server listens is normal at start.)
				Expect(events).NotTo(Or(ContainSubstring("Liveness probe failed"), ContainSubstring("BackOff")), p.Name)
				for _, cs := range p.Status.ContainerStatuses {
					Expect(cs.Ready).To(BeTrue(), "%s: %s", p.Name, events)
					if cs.RestartCount > 0 {
						Expect(cs.LastTerminationState.Terminated).NotTo(BeNil())
						Expect(cs.LastTerminationState.Terminated.ExitCode).To(BeEquivalentTo(137),
							"%s restarted after %+v: %s", p.Name, cs.LastTerminationState.Terminated, events)
					}
				}
			}
		}
		// The liveness endpoint answers (ipam-node is on the host network).
		Expect(ipamNodePod(ctx).Spec.Containers[0].LivenessProbe.HTTPGet).NotTo(BeNil())
	})

	It("delivers the node's blocks through its NodeIPAM, which the daemon reads instead of the pools", func(ctx SpecContext) {
		// The pools' status lists the blocks too (under the threshold): each
		// of the node's blocks is in its NodeIPAM, the controller's alone.
		var obj nodeipamv1.NodeIPAM
		Eventually(func(g Gomega) {
			g.Expect(cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: node.NodeName}, &obj)).To(Succeed())
			g.Expect(nodeipamv1.OwnedByController(&obj)).To(BeTrue(), "%+v", obj.ManagedFields)
			var pools v1alpha1.IPPoolList
			g.Expect(cl.List(ctx, &pools, client.InNamespace("kube-system"))).To(Succeed())
			g.Expect(pools.Items).NotTo(BeEmpty())
			for _, p := range pools.Items {
				for _, a := range p.Status.Allocations {
					if a.NodeName != node.NodeName {
						continue
					}
					g.Expect(obj.Spec.Blocks).To(ContainElement(And(HaveField("Pool", p.Name), HaveField("PoolUID", p.UID),
						HaveField("StartIP", a.StartIP), HaveField("EndIP", a.EndIP))), "pool %s", p.Name)
				}
			}
		}).WithContext(ctx).WithTimeout(time.Minute).Should(Succeed())
		logs, err := node.Kubectl(ctx, "-n", "kube-system", "logs", "daemonset/hwipam-node")
		Expect(err).NotTo(HaveOccurred())
		Expect(logs).To(ContainSubstring("reading this node's blocks from its NodeIPAM"))
		// The daemon may not write it: the controller's answer.
		out, err := node.Kubectl(ctx, "auth", "can-i", "update", "nodeipams.ipam.hwipam.io",
			"--as=system:serviceaccount:kube-system:hwipam-node", "-n", "kube-system")
		Expect(out).To(ContainSubstring("no"), "%v", err)
	})

	It("grants the binaries every API call they make (no RBAC refusal in their logs)", func(ctx SpecContext) {
		for _, obj := range []string{"daemonset/hwipam-node", "deployment/hwipam-controller"} {
			logs, err := node.Kubectl(ctx, "-n", "kube-system", "logs", obj)
			Expect(err).NotTo(HaveOccurred())
			Expect(logs).NotTo(ContainSubstring("forbidden"), obj)
		}
	})
})

var _ = Describe("the controller on a control-plane node", Label("deploy"), func() {
	It("is scheduled despite the control-plane taint", func(ctx SpecContext) {
		_, err := node.Kubectl(ctx, "taint", "node", node.NodeName, "node-role.kubernetes.io/control-plane=:NoSchedule")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			_, err := node.Kubectl(ctx, "taint", "node", node.NodeName, "node-role.kubernetes.io/control-plane=:NoSchedule-")
			Expect(err).NotTo(HaveOccurred())
		})
		_, err = node.Kubectl(ctx, "-n", "kube-system", "delete", "pod", "-l", "app.kubernetes.io/name=hwipam-controller", "--wait=true")
		Expect(err).NotTo(HaveOccurred())
		Expect(node.WaitRollout(ctx, 90*time.Second)).To(Succeed())
	})
})

// podEventsIn lists a pod's events, one per line, for failure messages.
func podEventsIn(ctx context.Context, namespace, name string) string {
	evs, err := node.Clientset.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

var _ = Describe("pods with Multus networks", Label("pods"), func() {
	It("get an address from each network's pool, inside the node's block", func(ctx SpecContext) {
		createPod(ctx, "two-nets", "e2e-a", "e2e-b")
		ips := networkIPs(waitReady(ctx, "two-nets"))
		Expect(ips).To(HaveLen(2))
		for _, pool := range []string{"e2e-a", "e2e-b"} {
			start, end := block(ctx, pool)
			Expect(ips[pool].Compare(start) >= 0 && ips[pool].Compare(end) <= 0).To(BeTrue(),
				"%s's address %s is outside the node's block %s-%s", pool, ips[pool], start, end)
		}
		// The addresses are on the pod's interfaces, as the pod itself sees them.
		out, err := node.Kubectl(ctx, "exec", "two-nets", "--", "ip", "-4", "-o", "addr", "show")
		Expect(err).NotTo(HaveOccurred())
		for _, ip := range ips {
			Expect(out).To(ContainSubstring(ip.String() + "/"))
		}
		Expect(allocations(ctx)).To(ContainElements(
			fmt.Sprintf("e2e-a %s %s/two-nets", ips["e2e-a"], ns), fmt.Sprintf("e2e-b %s %s/two-nets", ips["e2e-b"], ns)))
	})

	It("releases the address when the pod is deleted (kubelet's CNI DEL)", func(ctx SpecContext) {
		createPod(ctx, "short-lived", "e2e-a")
		ip := networkIPs(waitReady(ctx, "short-lived"))["e2e-a"]
		Expect(allocations(ctx)).To(ContainElement(fmt.Sprintf("e2e-a %s %s/short-lived", ip, ns)))
		deletePod(ctx, "short-lived")
		Expect(allocations(ctx)).NotTo(ContainElement(ContainSubstring("/short-lived")))
	})
})

var _ = Describe("the node daemon restarting", Label("restart"), Ordered, func() {
	var before []string
	BeforeAll(func(ctx SpecContext) {
		createPod(ctx, "keep-1", "e2e-a", "e2e-b")
		createPod(ctx, "keep-2", "e2e-a")
		waitReady(ctx, "keep-1")
		waitReady(ctx, "keep-2")
		before = allocations(ctx)
		Expect(before).To(ContainElement(ContainSubstring("/keep-2")))
	})

	It("keeps every allocation across a DaemonSet rollout restart", func(ctx SpecContext) {
		old := ipamNodePod(ctx).UID
		_, err := node.Kubectl(ctx, "-n", "kube-system", "rollout", "restart", "daemonset/hwipam-node")
		Expect(err).NotTo(HaveOccurred())
		Expect(node.WaitRollout(ctx, 2*time.Minute)).To(Succeed())
		Expect(ipamNodePod(ctx).UID).NotTo(Equal(old))
		Expect(allocations(ctx)).To(Equal(before))
		createPod(ctx, "after-rollout", "e2e-a")
		Expect(networkIPs(waitReady(ctx, "after-rollout"))).To(HaveKey("e2e-a"))
	})

	It("keeps every allocation across kill -9 of the ipam-node container", func(ctx SpecContext) {
		killIPAMNode(ctx)
		Eventually(ctx, func(g Gomega) {
			g.Expect(ipamNodePod(ctx).Status.ContainerStatuses[0].Ready).To(BeTrue())
		}).WithTimeout(90 * time.Second).WithPolling(time.Second).Should(Succeed())
		Expect(allocations(ctx)).To(Equal(before))
		createPod(ctx, "after-kill", "e2e-b")
		Expect(networkIPs(waitReady(ctx, "after-kill"))).To(HaveKey("e2e-b"))
	})
})

var _ = Describe("pools that follow a rail", Label("rail"), func() {
	railPool := func(name, subnet, netdev string) *v1alpha1.IPPool {
		return &v1alpha1.IPPool{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
			Spec: v1alpha1.IPPoolSpec{Subnet: subnet, PerNodeBlockSize: 16,
				NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{
						Key: "nic.hwipam.io/" + netdev, Operator: corev1.NodeSelectorOpIn, Values: []string{"ib"}}},
				}}}},
		}
	}

	It("give a block only to the node that has the rail, and pods on it addresses from it", func(ctx SpecContext) {
		// ipam-node's NIC discovery labelled the node from the sysfs tree.
		Eventually(ctx, func(g Gomega) {
			n, err := node.Clientset.CoreV1().Nodes().Get(ctx, node.NodeName, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(n.Labels).To(HaveKeyWithValue("nic.hwipam.io/ibp24s0", "ib"))
			g.Expect(n.Labels).To(HaveKeyWithValue("nic.hwipam.io/ibp24s0.model", "ConnectX-7"))
			g.Expect(n.Labels).NotTo(HaveKey("nic.hwipam.io/ibp999s0"))
		}).WithTimeout(60 * time.Second).Should(Succeed())

		Expect(cl.Create(ctx, railPool("rail-on", "10.33.0.0/24", "ibp24s0"))).To(Succeed())
		Expect(cl.Create(ctx, railPool("rail-off", "10.34.0.0/24", "ibp999s0"))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			for _, name := range []string{"rail-on", "rail-off"} {
				Expect(cl.Delete(ctx, &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"}})).To(Succeed())
			}
		})
		Eventually(ctx, func(g Gomega) {
			var p v1alpha1.IPPool
			g.Expect(cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "rail-on"}, &p)).To(Succeed())
			g.Expect(p.Status.Allocations).To(ConsistOf(HaveField("NodeName", node.NodeName)))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		var off v1alpha1.IPPool
		Expect(cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "rail-off"}, &off)).To(Succeed())
		Expect(off.Status.Allocations).To(BeEmpty())

		createNAD(ctx, "rail-on", macvlanConfig("rail-on", "rail-on", `"poolType": "ippool"`))
		createNAD(ctx, "rail-off", macvlanConfig("rail-off", "rail-off", `"poolType": "ippool"`))
		createPod(ctx, "on-rail", "rail-on")
		ip := networkIPs(waitReady(ctx, "on-rail"))["rail-on"]
		start, end := block(ctx, "rail-on")
		Expect(ip.Compare(start) >= 0 && ip.Compare(end) <= 0).To(BeTrue(), "%s outside %s-%s", ip, start, end)

		// A pool whose rail this node lacks: the pod is told why.
		createPod(ctx, "off-rail", "rail-off")
		Eventually(ctx, func() string { return podEvents(ctx, "off-rail") }).
			WithTimeout(60 * time.Second).WithPolling(time.Second).
			Should(And(ContainSubstring("FailedCreatePodSandBox"), ContainSubstring(`"rail-off" has no block on node `+node.NodeName)))
	})

	It("give a pod one address per rail from one NAD listed once per rail, through Multus", func(ctx SpecContext) {
		// Two pools bound to rails by label, and one NAD with "rail": "auto". The
		// pod lists the NAD twice, each time with the device it was given (a
		// network selection element's deviceID, which Multus passes through the
		// deviceID capability): the DGX tree's first two ConnectX-7 PFs.
		for _, p := range []struct{ name, subnet, rail string }{{"rails-24", "10.37.0.0/24", "ibp24s0"}, {"rails-64", "10.38.0.0/24", "ibp64s0"}} {
			pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "kube-system",
				Labels: map[string]string{"nic.hwipam.io/rail": p.rail}}, Spec: v1alpha1.IPPoolSpec{Subnet: p.subnet, PerNodeBlockSize: 16}}
			Expect(cl.Create(ctx, pool)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { Expect(cl.Delete(ctx, pool)).To(Succeed()) })
		}
		createNAD(ctx, "rails", fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "rails", "type": "macvlan", "master": %q, "mode": "bridge",
  "capabilities": {"deviceID": true},
  "ipam": {"type": "nv-ipam", "rail": "auto", "confDir": %q}}`, master, filepath.Join(node.CNIConfDir, "nv-ipam.d")))
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "two-rails", Namespace: ns, Annotations: map[string]string{nadv1.NetworkAttachmentAnnot: `[
  {"name": "rails", "interface": "net1", "deviceID": "0000:18:00.0"},
  {"name": "rails", "interface": "net2", "deviceID": "0000:40:00.0"}]`}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: node.BusyboxImage(), Command: []string{"sleep", "1000000"}}},
				TerminationGracePeriodSeconds: new(int64)},
		}
		_, err := node.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { deletePod(ctx, "two-rails") })
		var status []nadv1.NetworkStatus
		Expect(json.Unmarshal([]byte(waitReady(ctx, "two-rails").Annotations[nadv1.NetworkStatusAnnot]), &status)).To(Succeed())
		byIf := map[string]netip.Addr{}
		for _, st := range status {
			if st.Name == ns+"/rails" && len(st.IPs) > 0 {
				byIf[st.Interface] = netip.MustParseAddr(st.IPs[0])
			}
		}
		Expect(byIf).To(HaveLen(2), "network status: %+v", status)
		for iface, pool := range map[string]string{"net1": "rails-24", "net2": "rails-64"} {
			start, end := block(ctx, pool)
			Expect(byIf[iface].Compare(start) >= 0 && byIf[iface].Compare(end) <= 0).To(BeTrue(),
				"%s's address %s is outside rail pool %s's block %s-%s", iface, byIf[iface], pool, start, end)
		}
		// The daemon shows each address with its rail.
		resp, err := nodeInfo.ListAllocations(ctx, &infov1.ListAllocationsRequest{})
		Expect(err).NotTo(HaveOccurred())
		rails := map[string]string{}
		for _, a := range resp.GetAllocations() {
			if a.GetPodName() == "two-rails" {
				rails[a.GetIfName()] = a.GetRail() + " " + a.GetPool()
			}
		}
		Expect(rails).To(Equal(map[string]string{"net1": "ibp24s0 rails-24", "net2": "ibp64s0 rails-64"}))
	})
})

var _ = Describe("a malformed NetworkAttachmentDefinition", Label("malformed"), func() {
	It("gives the pod a clear event instead of a hung sandbox", func(ctx SpecContext) {
		createNAD(ctx, "bad-pooltype", macvlanConfig("bad-pooltype", "e2e-a", `"poolType": "bogus"`))
		start := time.Now()
		createPod(ctx, "bad-net", "bad-pooltype")
		Eventually(ctx, func() string { return podEvents(ctx, "bad-net") }).
			WithTimeout(60 * time.Second).WithPolling(time.Second).
			Should(And(ContainSubstring("FailedCreatePodSandBox"), ContainSubstring(`poolType "bogus": want ippool or cidrpool`)))
		fmt.Fprintf(GinkgoWriter, "event after %.1fs:%s\n", time.Since(start).Seconds(), podEvents(ctx, "bad-net"))
		pod, err := node.Clientset.CoreV1().Pods(ns).Get(ctx, "bad-net", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(pod.Status.Phase).To(Equal(corev1.PodPending))
		// Nothing was allocated for it.
		Expect(allocations(ctx)).NotTo(ContainElement(ContainSubstring("/bad-net")))
	})
})

// execCtr runs ctr against the node's containerd.
func execCtr(ctx context.Context, args ...string) (string, error) {
	return realnode.Ctr(ctx, node, args...)
}
