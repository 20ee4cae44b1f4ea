package realnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/test/harness"
	"github.com/hwipam/hwipam/test/monitoring"
	"github.com/hwipam/hwipam/test/realnode"
)

// draRails are the DGX-H100 tree's rails the DRA specs give host links (veths
// named like them, as make demo does for the first two, which the ipamctl
// specs use): rails 2 and 3 share root complex pci0000:4c with GPUs 2 and 3,
// rails 4 and 5 pci0000:97 with GPUs 4 and 5, rail 6 pci0000:cb (and the
// switch of GPU 6).
var draRails = fakesysfs.DGXH100Rails[2:7]

// railSubnet is the subnet of a DRA rail's pool: docs/dra.md's for rails 2
// and 3 (10.79, 10.94), the same shape for the others.
func railSubnet(rail string) string {
	return "10." + strings.TrimSuffix(strings.TrimPrefix(rail, "ibp"), "s0") + ".0.0/16"
}

var _ = Describe("the DRA driver nic.hwipam.io on the real node", Label("dra"), Ordered, func() {
	var treeRoot string
	var draOpts realnode.DeployOptions
	BeforeAll(func(ctx SpecContext) {
		for i, r := range draRails {
			_, err := netlink.LinkByName(r)
			Expect(err).To(HaveOccurred(), "a host link %s exists already (is `make demo` running?)", r)
			Expect(node.AddVeth(r, fmt.Sprintf("%sx%d", node.Prefix, i))).To(Succeed())
		}
		opts, err := node.BaseOptions()
		Expect(err).NotTo(HaveOccurred())
		Expect(opts.HostPaths).NotTo(BeEmpty())
		treeRoot = opts.HostPaths[0]
		DeferCleanup(func(ctx SpecContext) {
			Expect(node.Undeploy(ctx)).To(Succeed())
			// The driver's slices stay after it stops (their owner is the Node).
			Expect(node.Clientset.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
				metav1.ListOptions{FieldSelector: "spec.driver=" + nicdra.DriverName})).To(Succeed())
			Expect(node.Redeploy(ctx)).To(Succeed())
		}, NodeTimeout(5*time.Minute))
		Expect(node.Undeploy(ctx)).To(Succeed())
		opts.Overlay = "deploy/overlays/dra"
		draOpts = opts
		Expect(node.Deploy(ctx, harness.RepoRoot(), opts)).To(Succeed())

		stop, err := node.StartGPUDriver(ctx, treeRoot, fakesysfs.DGXH100GPUs, logr.Discard())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			stop()
			Expect(node.Clientset.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
				metav1.ListOptions{FieldSelector: "spec.driver=" + realnode.GPUDriverName})).To(Succeed())
			_ = node.Clientset.ResourceV1().DeviceClasses().Delete(ctx, realnode.GPUDriverName, metav1.DeleteOptions{})
		})
		kubectlApply(ctx, realnode.GPUDeviceClass)

		// The pools: docs/dra.md's (rails 2 and 3), the same for the others.
		for _, r := range draRails {
			if slices.Contains([]string{"ibp79s0", "ibp94s0"}, r) {
				continue
			}
			Expect(cl.Create(ctx, &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail-" + r, Namespace: "kube-system",
				Labels: map[string]string{v1alpha1.LabelRail: r}},
				Spec: v1alpha1.IPPoolSpec{Subnet: railSubnet(r), PerNodeBlockSize: 64, Gateway: strings.Replace(railSubnet(r), "0.0/16", "0.1", 1)}})).To(Succeed())
		}
		DeferCleanup(func(ctx SpecContext) {
			for _, r := range draRails {
				Expect(client.IgnoreNotFound(cl.Delete(ctx, &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail-" + r,
					Namespace: "kube-system"}}))).To(Succeed())
			}
		})
		for _, doc := range docYAML(filepath.Join(harness.RepoRoot(), "docs", "dra.md")) {
			if strings.Contains(doc, "kind: IPPool") {
				kubectlApply(ctx, doc)
			}
		}
		for _, r := range draRails {
			waitBlock(ctx, "rail-"+r)
		}
		// The node's slice: every DRA rail with its pool.
		Eventually(ctx, func(g Gomega) {
			devs := nicDevices(ctx, g)
			for _, r := range draRails {
				d, ok := devs[r]
				g.Expect(ok).To(BeTrue(), "no device of rail %s in %v", r, slices.Sorted(maps.Keys(devs)))
				g.Expect(d.Attributes[nicdra.AttrPool].StringValue).To(HaveValue(Equal("rail-" + r)))
				g.Expect(d.Attributes[nicdra.AttrPreparable].BoolValue).To(HaveValue(BeTrue()), "rail %s", r)
			}
			// The tree's last rail has neither a link on the host nor a pool:
			// published, but the scheduler can tell it cannot be prepared
			// (issue 39, item 4).
			last := fakesysfs.DGXH100Rails[7]
			d, ok := devs[last]
			g.Expect(ok).To(BeTrue(), "no device of rail %s", last)
			g.Expect(d.Attributes[nicdra.AttrNetdevOnHost].BoolValue).To(HaveValue(BeFalse()), "rail %s", last)
			g.Expect(d.Attributes[nicdra.AttrPreparable].BoolValue).To(HaveValue(BeFalse()), "rail %s", last)
		}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		// First of the cleanups (they run last to first): the pods and their
		// claims go while both drivers are there to unprepare them.
		DeferCleanup(deleteDocObjects, NodeTimeout(3*time.Minute))
	}, NodeTimeout(10*time.Minute))

	It("gives docs/dra.md's pods their NICs with their rails' addresses", func(ctx SpecContext) {
		for _, doc := range docYAML(filepath.Join(harness.RepoRoot(), "docs", "dra.md")) {
			if strings.Contains(doc, "kind: IPPool") {
				continue
			}
			kubectlApply(ctx, strings.ReplaceAll(doc, "image: busybox", "image: "+node.BusyboxImage()))
		}
		// rail-pod: rail 2's NIC as net1, an address of its pool.
		got := expectDRAPod(ctx, "rail-pod", "net1")
		Expect(got.rail).To(Equal("ibp79s0"))
		// Its container has the port's RDMA character devices, with the numbers
		// of the tree's dev files (rail 2's user verbs device is uverbs2, 231:194).
		out, err := node.Kubectl(ctx, "-n", ns, "exec", "rail-pod", "--", "ls", "-l", "/dev/infiniband/")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(And(MatchRegexp(`(?m)^crw.*231,\s*194 .*uverbs2$`), MatchRegexp(`(?m)^crw.*10,\s*58 .*rdma_cm$`)), "ls -l /dev/infiniband in rail-pod:\n%s", out)
		fmt.Fprintf(GinkgoWriter, "rail-pod's /dev/infiniband:\n%s\n", out)
		// static-pod: rail 3's, the address asked for.
		got = expectDRAPod(ctx, "static-pod", "net1")
		Expect(got.rail).To(Equal("ibp94s0"))
		Expect(got.addrs).To(ConsistOf("10.94.0.20/16"))
		// gpu4-pod: GPU 4 and a NIC of its root complex, pci0000:97: rail 4 or 5.
		got = expectDRAPod(ctx, "gpu4-pod", "")
		Expect(got.gpu).To(Equal("gpu-4"))
		Expect(got.rail).To(BeElementOf("ibp154s0", "ibp192s0"))
		Expect(got.pcieRoot).To(Equal("pci0000:97"))
		// gpu6-pod: GPU 6 and the NIC on its switch, rail 6.
		got = expectDRAPod(ctx, "gpu6-pod", "")
		Expect(got.gpu).To(Equal("gpu-6"))
		Expect(got.rail).To(Equal("ibp206s0"))
	})

	It("aligns another GPU by root complex", func(ctx SpecContext) {
		// rail-pod and static-pod hold rails 2 and 3: free them for GPU 3's root
		// complex, pci0000:4c.
		for _, p := range []string{"rail-pod", "static-pod"} {
			deletePod(ctx, p)
		}
		createClaimPod(ctx, "gpu3-pod", realnode.GPUAndNIC(3, `device.attributes["nic.hwipam.io"].linkType == "ib"`))
		got := expectDRAPod(ctx, "gpu3-pod", "")
		Expect(got.gpu).To(Equal("gpu-3"))
		Expect(got.rail).To(BeElementOf("ibp79s0", "ibp94s0"))
		Expect(got.pcieRoot).To(Equal("pci0000:4c"))
		// ipamctl in the ipam-node pod lists the allocation with its claim.
		out, err := node.Kubectl(ctx, "-n", "kube-system", "exec", ipamNodePod(ctx).Name, "-c", "ipam-node", "--", "/ipamctl", "allocations")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(MatchRegexp(`(?m)^.*%s.*nic\.hwipam\.io.*%s/gpu3-pod.*%s/gpu3-pod`, regexp.QuoteMeta(strings.Split(got.addrs[0], "/")[0]), ns, ns))
		fmt.Fprintf(GinkgoWriter, "ipamctl allocations:\n%s\n", out)
		// ipamctl check there: the plugin registered, the slices published, the
		// claim's address in the store.
		out, _ = node.Kubectl(ctx, "-n", "kube-system", "exec", ipamNodePod(ctx).Name, "-c", "ipam-node", "--", "/ipamctl", "check")
		Expect(out).To(And(MatchRegexp(`(?m)^ok\s+dra\s+nic\.hwipam\.io\s+registered with the kubelet`),
			MatchRegexp(`(?m)^ok\s+slices\s+nic\.hwipam\.io\s+the API server has the \d+ device\(s\)`),
			MatchRegexp(`(?m)^ok\s+claim\s+-\s+\d+ prepared claim\(s\), each address held in the store`)), "ipamctl check:\n%s", out)
		Expect(out).NotTo(MatchRegexp(`(?m)^error\s+(dra|slices|claim)`), "ipamctl check:\n%s", out)

		// The pod goes: the netdev is back on the host under its name, the
		// address released.
		deletePod(ctx, "gpu3-pod")
		Eventually(ctx, func(g Gomega) {
			l, err := netlink.LinkByName(got.rail)
			g.Expect(err).NotTo(HaveOccurred(), "%s is not back on the host", got.rail)
			addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(addrs).To(BeEmpty(), "%s came back with addresses", got.rail)
			g.Expect(allocations(ctx)).NotTo(ContainElement(ContainSubstring(" " + strings.Split(got.addrs[0], "/")[0] + " ")))
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	})

	It("refuses bad claims with an event that says what is wrong, and allocates nothing", func(ctx SpecContext) {
		before := allocations(ctx)
		railNIC := func(config string, extra ...resourceapi.DeviceRequest) resourceapi.ResourceClaimSpec {
			spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: append([]resourceapi.DeviceRequest{{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicdra.DriverName,
					Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
						Expression: `device.attributes["nic.hwipam.io"].rail == "ibp79s0"`}}}}}}, extra...)}}
			requests := []string{"nic"}
			if len(extra) > 0 {
				requests = []string{extra[0].Name}
			}
			spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: nicdra.DriverName, Parameters: runtime.RawExtension{
					Raw: []byte(`{"apiVersion":"nic.hwipam.io/v1alpha1","kind":"NicConfig",` + config + `}`)}}}}}
			return spec
		}
		gpu := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: realnode.GPUDriverName,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.attributes["gpu.nvidia.com"].index == 2`}}}}}
		for _, c := range []struct{ name, config, says string }{
			{"bad-pool", `"pool":"no-such-pool"`, "no-such-pool"},
			{"bad-static", `"ips":["10.1.2.3"]`, "10.1.2.3"},
			{"bad-ifname", `"interfaceName":"a-name-far-too-long"`, "interfaceName"},
			{"bad-target", `"interfaceName":"net1"`, `request "gpu", whose device is of driver gpu.nvidia.com`},
		} {
			By(c.name)
			spec := railNIC(c.config)
			if c.name == "bad-target" {
				spec = railNIC(c.config, gpu)
			}
			createClaimPod(ctx, c.name, spec)
			Eventually(ctx, func(g Gomega) {
				ev := podEvents(ctx, c.name)
				g.Expect(ev).To(And(ContainSubstring("FailedPrepareDynamicResources"), ContainSubstring(c.says)), "events of %s", c.name)
			}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
			fmt.Fprintf(GinkgoWriter, "%s: %s\n", c.name, podEvents(ctx, c.name))
			// ipamctl check on the node says so too (issue 39, item 5), once
			// the driver's status file has it (written within a second of a
			// failure, and every 10 s).
			Eventually(ctx, func(g Gomega) {
				out, _ := node.Kubectl(ctx, "-n", "kube-system", "exec", ipamNodePod(ctx).Name, "-c", "ipam-node", "--", "/ipamctl", "check")
				g.Expect(out).To(MatchRegexp(`(?m)^warning\s+failure\s+claim `+ns+`/`+c.name+`\s.*preparing claim `+ns+`/`+c.name+` failed`),
					"ipamctl check:\n%s", out)
			}).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())
			pod, err := node.Clientset.CoreV1().Pods(ns).Get(ctx, c.name, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(pod.Status.Phase).To(Equal(corev1.PodPending))
			Expect(allocations(ctx)).To(Equal(before))
			deletePod(ctx, c.name)
		}
		// The rail's NIC is still there for a good claim.
		_, err := netlink.LinkByName("ibp79s0")
		Expect(err).NotTo(HaveOccurred())
	})

	// Issue 45, item 6: a claim whose opaque parameters a client sent with
	// spaces (Python's json.dumps) keeps them byte for byte, and so does the
	// real kube-scheduler's copy in status.allocation; the driver's status
	// write must leave them so, or the API server refuses it and the pod never
	// starts.
	It("starts a pod whose claim's configuration was sent with spaces", func(ctx SpecContext) {
		const name = "spaced-pod"
		body := `{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "` + name + `"},
  "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.hwipam.io",
      "selectors": [{"cel": {"expression": "device.attributes[\"nic.hwipam.io\"].rail == \"ibp79s0\""}}]}}],
    "config": [{"requests": ["nic"], "opaque": {"driver": "nic.hwipam.io",
      "parameters": {"apiVersion": "nic.hwipam.io/v1alpha1", "kind": "NicConfig", "interfaceName": "net7"}}}]}}}`
		out, err := node.Clientset.ResourceV1().RESTClient().Post().Namespace(ns).Resource("resourceclaims").
			SetHeader("Content-Type", "application/json").Body([]byte(body)).DoRaw(ctx)
		Expect(err).NotTo(HaveOccurred(), "creating claim %s: %s", name, out)
		createPodFor(ctx, name)
		got := expectDRAPod(ctx, name, "net7")
		Expect(got.rail).To(Equal("ibp79s0"))
		raw, err := node.Clientset.ResourceV1().RESTClient().Get().Namespace(ns).Resource("resourceclaims").Name(name).
			SetHeader("Accept", "application/vnd.kubernetes.protobuf").DoRaw(ctx)
		Expect(err).NotTo(HaveOccurred())
		// In the claim's spec and in the scheduler's copy in status.allocation.
		Expect(strings.Count(string(raw), `"interfaceName": "net7"`)).To(Equal(2), "the spaces of the claim's parameters")
		deletePod(ctx, name)
		Eventually(ctx, func() error {
			_, err := netlink.LinkByName("ibp79s0")
			return err
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "ibp79s0 is not back on the host")
	})

	// Issue 45: the RDMA character devices of a claim's port go to the
	// containers that reference the claim, by the claim's CDI spec, which the
	// kubelet hands containerd for those containers only; a container of the
	// same pod that does not list the claim sees none (with NRI they went to
	// every container). The tree's dev files stand in for the devices.
	It("gives a claim's RDMA devices only to the containers that reference it", func(ctx SpecContext) {
		const name = "cdi-pod"
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: railClaim("ibp79s0")}
		_, err := node.Clientset.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			deletePod(ctx, name)
			Expect(client.IgnoreNotFound(node.Clientset.ResourceV1().ResourceClaims(ns).Delete(ctx, name, metav1.DeleteOptions{}))).To(Succeed())
		})
		sleeper := func(n string) corev1.Container {
			return corev1.Container{Name: n, Image: node.BusyboxImage(), Command: []string{"sleep", "1000000"}}
		}
		app, side := sleeper("app"), sleeper("side")
		app.Resources.Claims = []corev1.ResourceClaim{{Name: "c"}}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: &claim.Name}},
			Containers:                    []corev1.Container{app, side},
			TerminationGracePeriodSeconds: new(int64(1))}}
		_, err = node.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		got := expectDRAPod(ctx, name, "")
		Expect(got.rail).To(Equal("ibp79s0"))
		out, err := node.Kubectl(ctx, "-n", ns, "exec", name, "-c", "app", "--", "ls", "-l", "/dev/infiniband/")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(And(MatchRegexp(`(?m)^crw.*231,\s*194 .*uverbs2$`), MatchRegexp(`(?m)^crw.*10,\s*58 .*rdma_cm$`)),
			"ls -l /dev/infiniband in the container that lists the claim:\n%s", out)
		fmt.Fprintf(GinkgoWriter, "%s/app's /dev/infiniband:\n%s\n", name, out)
		out, err = node.Kubectl(ctx, "-n", ns, "exec", name, "-c", "side", "--", "ls", "/dev/infiniband/")
		Expect(err).To(HaveOccurred(), "the container that does not list the claim has /dev/infiniband:\n%s", out)
		Expect(out).To(ContainSubstring("No such file or directory"))
		// The claim's spec is in the node's CDI directory while it is
		// prepared, and gone once the pod is.
		c, err := node.Clientset.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		spec := filepath.Join(node.CDIDir(), "k8s.nic.hwipam.io-claim_"+string(c.UID)+".json")
		Expect(spec).To(BeAnExistingFile())
		deletePod(ctx, name)
		Eventually(ctx, func() bool {
			_, err := os.Stat(spec)
			return os.IsNotExist(err)
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeTrue(), "the unprepared claim's CDI spec %s", spec)
		Eventually(ctx, func() error {
			_, err := netlink.LinkByName("ibp79s0")
			return err
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "ibp79s0 is not back on the host")
	})

	// Issue 46: every metric deploy/monitoring's dashboard and alerts query is
	// one the real daemons export (ipam-node with the DRA driver, whose claims
	// have been prepared, and ipam-controller, whose pools have been reconciled).
	It("exports every metric the dashboard and the alerts query", func(ctx SpecContext) {
		families := monitoring.Families(nodeMetrics(ctx) + "\n" + controllerMetrics(ctx))
		d, err := monitoring.ReadDashboard(harness.RepoRoot())
		Expect(err).NotTo(HaveOccurred())
		groups, err := monitoring.Rules(harness.RepoRoot())
		Expect(err).NotTo(HaveOccurred())
		queries := d.Queries()
		for _, g := range groups {
			for _, r := range g.Rules {
				queries = append(queries, r.Expr)
			}
		}
		var missing []string
		names := monitoring.MetricNames(queries...)
		for _, n := range names {
			if n == "up" || strings.Contains(n, ":") {
				continue // Prometheus's own, and the recording rules'
			}
			if !monitoring.Exported(n, families) {
				missing = append(missing, n)
			}
		}
		Expect(missing).To(BeEmpty(), "metrics the dashboard or the alerts query that the daemons do not export")
		fmt.Fprintf(GinkgoWriter, "the dashboard and the alerts query %d metrics, all exported: %v\n", len(names), names)
	})

	It("loses and leaks nothing when ipam-node is killed between prepare and the sandbox's start", func(ctx SpecContext) {
		createClaimPod(ctx, "kill-pod", railClaim("ibp79s0"))
		// Killed as soon as the claim's status shows its address: its sandbox
		// may or may not have started; the NRI plugin, once back, attaches.
		Eventually(ctx, func(g Gomega) {
			c, err := node.Clientset.ResourceV1().ResourceClaims(ns).Get(ctx, "kill-pod", metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.Status.Devices).To(HaveLen(1))
		}).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).Should(Succeed())
		killIPAMNode(ctx)
		got := expectDRAPod(ctx, "kill-pod", "ibp79s0")
		held := 0
		for _, a := range allocations(ctx) {
			if strings.HasPrefix(a, "rail-ibp79s0 ") {
				held++
			}
		}
		Expect(held).To(Equal(1), "rail ibp79s0's pool holds %d addresses for one claim (%v)", held, got.addrs)
	})

	It("releases a claim deleted while ipam-node is down", func(ctx SpecContext) {
		createClaimPod(ctx, "gone-pod", railClaim("ibp94s0"))
		got := expectDRAPod(ctx, "gone-pod", "ibp94s0")
		ip := strings.Split(got.addrs[0], "/")[0]
		// Down: the pod and its claim go without the driver to unprepare it.
		killIPAMNode(ctx)
		zero := int64(0)
		Expect(node.Clientset.CoreV1().Pods(ns).Delete(ctx, "gone-pod", metav1.DeleteOptions{GracePeriodSeconds: &zero})).To(Succeed())
		Expect(node.Clientset.ResourceV1().ResourceClaims(ns).Delete(ctx, "gone-pod", metav1.DeleteOptions{})).To(Succeed())
		Eventually(ctx, func(g Gomega) {
			_, err := node.Clientset.ResourceV1().ResourceClaims(ns).Get(ctx, "gone-pod", metav1.GetOptions{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the claim is still there: %v", err)
			g.Expect(allocations(ctx)).NotTo(ContainElement(ContainSubstring(" " + ip + " ")))
		}).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		// The sandbox stopped while no NRI plugin listened: a physical port
		// returns to the host by itself, a veth (this node's stand-in) goes
		// with the pod's namespace; then it is made again for what follows.
		peer := node.Prefix + "x1"
		Eventually(ctx, func() bool {
			_, onHost := netlink.LinkByName("ibp94s0")
			_, peerThere := netlink.LinkByName(peer)
			return onHost == nil || peerThere != nil // back, or gone with its namespace
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(BeTrue(), "ibp94s0 is neither back on the host nor gone")
		if _, err := netlink.LinkByName("ibp94s0"); err != nil {
			fmt.Fprintf(GinkgoWriter, "ibp94s0 went with the pod's namespace (a veth); made again\n")
			Expect(exec.Command("ip", "link", "add", "ibp94s0", "type", "veth", "peer", "name", peer).Run()).To(Succeed())
			Expect(exec.Command("ip", "link", "set", peer, "up").Run()).To(Succeed())
			Expect(exec.Command("ip", "link", "set", "ibp94s0", "up").Run()).To(Succeed())
		} else {
			fmt.Fprintf(GinkgoWriter, "ibp94s0 came back to the host\n")
		}
	})

	It("starts a pod with a claim about as fast as one with a Multus NAD (figure)", func(ctx SpecContext) {
		const rounds = 3 // a median each way; make test's time is bounded
		var dra, multus []time.Duration
		for i := range rounds {
			start := time.Now()
			name := fmt.Sprintf("start-dra-%d", i)
			createClaimPod(ctx, name, railClaim("ibp79s0"))
			waitReady(ctx, name)
			dra = append(dra, time.Since(start))
			deletePod(ctx, name)
			Expect(node.Clientset.ResourceV1().ResourceClaims(ns).Delete(ctx, name, metav1.DeleteOptions{})).To(Succeed())

			start = time.Now()
			name = fmt.Sprintf("start-nad-%d", i)
			createPod(ctx, name, "e2e-a")
			waitReady(ctx, name)
			multus = append(multus, time.Since(start))
			deletePod(ctx, name)
		}
		slices.Sort(dra)
		slices.Sort(multus)
		fmt.Fprintf(GinkgoWriter, "FIGURE pod creation to Ready, %d rounds, alternating: DRA claim median %v (%v), Multus NAD median %v (%v)\n",
			rounds, dra[rounds/2], dra, multus[rounds/2], multus)
		metrics := scrapeMetrics(ctx)
		fmt.Fprintf(GinkgoWriter, "FIGURE ipam-node prepare: %s\n", metrics)
		// Not a race: a claim's pod waits for no more than its NAD twin plus a
		// second (the prepare, the status write and the attach).
		Expect(dra[rounds/2]).To(BeNumerically("<", multus[rounds/2]+time.Second))
	})

	// The ownership walkthrough of issue 36: a port in use by a Multus pod, a
	// claim two pods name, the state a port comes back in, and ipam-node away
	// while a claim's pod stops. On rail 3 (ibp94s0), which the specs above
	// leave free.
	It("withholds a port that a Multus pod uses as its master, and says who uses it", func(ctx SpecContext) {
		createNAD(ctx, "on-"+ownerRail, fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "on-%s", "type": "macvlan", "master": %q,
  "mode": "bridge", "ipam": {"type": "nv-ipam", "poolName": "e2e-b", "confDir": %q}}`, ownerRail, ownerRail,
			filepath.Join(node.CNIConfDir, "nv-ipam.d")))
		createPod(ctx, "nad-master", "on-"+ownerRail)
		waitReady(ctx, "nad-master")
		Eventually(ctx, func(g Gomega) {
			g.Expect(nicDevices(ctx, g)).NotTo(HaveKey(ownerRail), "rail %s is still published while pod nad-master uses it", ownerRail)
		}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
		out, _ := node.Kubectl(ctx, "-n", "kube-system", "exec", ipamNodePod(ctx).Name, "-c", "ipam-node", "--", "/ipamctl", "check")
		Expect(out).To(MatchRegexp(`(?m)^info\s+slices\s+pci-\S+ \(\S+, %s\)\s+not published to claims: in use by pod %s/nad-master`,
			ownerRail, ns), "ipamctl check:\n%s", out)
		fmt.Fprintf(GinkgoWriter, "ipamctl check while nad-master uses %s:\n%s\n", ownerRail, out)

		// A claim for the rail is not allocated the port meanwhile: its pod
		// stays pending, and the NAD pod keeps its link.
		createClaimPod(ctx, "wants-"+ownerRail, railClaim(ownerRail))
		Consistently(ctx, func(g Gomega) {
			p, err := node.Clientset.CoreV1().Pods(ns).Get(ctx, "wants-"+ownerRail, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Status.Phase).To(Equal(corev1.PodPending))
			g.Expect(p.Spec.NodeName).To(BeEmpty(), "the claim's pod was scheduled onto the port nad-master uses")
		}).WithTimeout(15 * time.Second).WithPolling(time.Second).Should(Succeed())
		out, err := node.Kubectl(ctx, "-n", ns, "exec", "nad-master", "--", "ip", "link", "show", "net1")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("LOWER_UP"), "nad-master's net1 lost its carrier:\n%s", out)

		// The NAD pod goes: the port is published again and the claim gets it.
		deletePod(ctx, "nad-master")
		got := expectDRAPod(ctx, "wants-"+ownerRail, ownerRail)
		Expect(got.rail).To(Equal(ownerRail))

		// The reverse: a NAD pod on the port the claim holds fails, and
		// ipamctl check says which claim holds the port.
		createPod(ctx, "nad-late", "on-"+ownerRail)
		Eventually(ctx, func(g Gomega) {
			g.Expect(podEvents(ctx, "nad-late")).To(ContainSubstring("FailedCreatePodSandBox"))
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		fmt.Fprintf(GinkgoWriter, "nad-late: %s\n", podEvents(ctx, "nad-late"))
		out, _ = node.Kubectl(ctx, "-n", "kube-system", "exec", ipamNodePod(ctx).Name, "-c", "ipam-node", "--", "/ipamctl", "check")
		Expect(out).To(MatchRegexp(`(?m)^info\s+claim\s+%s/wants-%s\s+claim %s/wants-%s holds port pci-\S+ \(\S+, host netdev %s\)`,
			ns, ownerRail, ns, ownerRail, ownerRail), "ipamctl check:\n%s", out)
		deletePod(ctx, "nad-late")
		deletePod(ctx, "wants-"+ownerRail)
	})

	It("returns a port to the host as it was before the claim: its name, up, no addresses", func(ctx SpecContext) {
		l, err := netlink.LinkByName(ownerRail)
		Expect(err).NotTo(HaveOccurred())
		Expect(l.Attrs().Flags&net.FlagUp).NotTo(BeZero(), "%s is down before the claim", ownerRail)
		createClaimPod(ctx, "back-up", railClaim(ownerRail))
		expectDRAPod(ctx, "back-up", ownerRail)
		deletePod(ctx, "back-up")
		Eventually(ctx, func(g Gomega) {
			l, err := netlink.LinkByName(ownerRail)
			g.Expect(err).NotTo(HaveOccurred(), "%s is not back on the host", ownerRail)
			g.Expect(l.Attrs().Flags&net.FlagUp).NotTo(BeZero(), "%s came back down (it was up before the claim)", ownerRail)
			addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(addrs).To(BeEmpty(), "%s came back with addresses", ownerRail)
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	})

	It("refuses a second pod on a claim that a running pod holds", func(ctx SpecContext) {
		createClaimPod(ctx, "shared-1", railClaim(ownerRail))
		first := expectDRAPod(ctx, "shared-1", ownerRail)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "shared-2", Namespace: ns},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: new("shared-1")}},
				Containers: []corev1.Container{{Name: "app", Image: node.BusyboxImage(), Command: []string{"sleep", "1000000"},
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "c"}}}}},
				TerminationGracePeriodSeconds: new(int64(1)),
			}}
		_, err := node.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { deletePod(ctx, "shared-2") })
		// Refused with an event that says why; never running without its NIC.
		Eventually(ctx, func(g Gomega) {
			g.Expect(podEvents(ctx, "shared-2")).To(ContainSubstring("cannot be shared"))
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		fmt.Fprintf(GinkgoWriter, "shared-2: %s\n", podEvents(ctx, "shared-2"))
		p, err := node.Clientset.CoreV1().Pods(ns).Get(ctx, "shared-2", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(p.Status.Phase).To(Equal(corev1.PodPending), "shared-2 runs without its claim's NIC")
		// The first pod keeps its port and address.
		out, err := node.Kubectl(ctx, "-n", ns, "exec", "shared-1", "--", "ip", "-o", "addr", "show", "dev", ownerRail)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("inet " + first.addrs[0]))
		deletePod(ctx, "shared-2")
		deletePod(ctx, "shared-1")
	})

	It("leaves nothing held and no port under a pod's name when ipam-node is away while a claim's pod stops", func(ctx SpecContext) {
		createClaimPod(ctx, "stop-away", railClaim(ownerRail))
		got := expectDRAPod(ctx, "stop-away", ownerRail)
		ip := strings.Split(got.addrs[0], "/")[0]
		// Killed, and the pod deleted at once: its sandbox stops while no NRI
		// plugin listens (every rollout of the DaemonSet has that gap).
		pod := ipamNodePod(ctx)
		id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
		out, err := execCtr(ctx, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id)
		Expect(err).NotTo(HaveOccurred(), out)
		deletePod(ctx, "stop-away")
		Expect(node.Clientset.ResourceV1().ResourceClaims(ns).Delete(ctx, "stop-away", metav1.DeleteOptions{})).To(Succeed())
		// Once ipam-node is back the kubelet unprepares: the address is
		// released, and no link of the host carries a pod-side name.
		Eventually(ctx, func(g Gomega) {
			g.Expect(allocations(ctx)).NotTo(ContainElement(ContainSubstring(" " + ip + " ")))
		}).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		links, err := netlink.LinkList()
		Expect(err).NotTo(HaveOccurred())
		for _, l := range links {
			Expect(l.Attrs().Name).NotTo(MatchRegexp(`^(net\d+|dev\d+)$`), "a port came back under a pod-side name")
		}
		// The stand-in veth went with the pod's namespace (a physical port
		// would have come back and been renamed); made again for what follows.
		if _, err := netlink.LinkByName(ownerRail); err != nil {
			fmt.Fprintf(GinkgoWriter, "%s went with the pod's namespace (a veth); made again\n", ownerRail)
			peer := node.Prefix + "x1"
			Expect(exec.Command("ip", "link", "add", ownerRail, "type", "veth", "peer", "name", peer).Run()).To(Succeed())
			Expect(exec.Command("ip", "link", "set", peer, "up").Run()).To(Succeed())
			Expect(exec.Command("ip", "link", "set", ownerRail, "up").Run()).To(Succeed())
		} else {
			l, _ := netlink.LinkByName(ownerRail)
			addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
			Expect(addrs).To(BeEmpty(), "%s came back with the pod's addresses", ownerRail)
		}
		// Once the restarted plugin is registered again, check finds nothing
		// wrong with the driver, its slices or its claims.
		Eventually(ctx, func(g Gomega) {
			out, _ := node.Kubectl(ctx, "-n", "kube-system", "exec", ipamNodePod(ctx).Name, "-c", "ipam-node", "--", "/ipamctl", "check")
			g.Expect(out).NotTo(MatchRegexp(`(?m)^error\s+(dra|slices|claim)`), "ipamctl check:\n%s", out)
		}).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	})

	It("runs docs/demo.md's NIC claim as written: a port that can be prepared, never one without a pool or netdev", func(ctx SpecContext) {
		docs := docYAML(filepath.Join(harness.RepoRoot(), "docs", "demo.md"))
		var nic []string
		for _, d := range docs {
			if strings.Contains(d, "kind: ResourceClaimTemplate") || strings.Contains(d, "name: try-nic\n") {
				nic = append(nic, d)
			}
		}
		Expect(nic).NotTo(BeEmpty(), "docs/demo.md has no NIC claim")
		for _, d := range nic {
			kubectlApply(ctx, strings.ReplaceAll(d, "REGISTRY/busybox:hwipam", node.BusyboxImage()))
		}
		DeferCleanup(func(ctx SpecContext) {
			deletePod(ctx, "try-nic")
			Expect(client.IgnoreNotFound(node.Clientset.ResourceV1().ResourceClaimTemplates(ns).Delete(ctx, "try-nic",
				metav1.DeleteOptions{}))).To(Succeed())
		})
		got := expectDRAPod(ctx, "try-nic", "net1")
		Expect(got.rail).To(BeElementOf(draRails), "try-nic got a port of rail %s, which has no pool or no link here", got.rail)
		fmt.Fprintf(GinkgoWriter, "try-nic: rail %s, %v\n", got.rail, got.addrs)
		// ipamctl gpus in the daemon's pod: the port's GPU row names the claim,
		// the pod, net1 and the address (issue 39, item 5).
		out, err := node.Kubectl(ctx, "-n", "kube-system", "exec", ipamNodePod(ctx).Name, "-c", "ipam-node", "--", "/ipamctl", "gpus")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(MatchRegexp(`(?m)^\d+\s+\S+\s+`+got.rail+`\s.*\s`+ns+`/`+got.claim+`\s+`+ns+`/try-nic\s+net1\s+`+
			regexp.QuoteMeta(got.addrs[0])), "ipamctl gpus:\n%s", out)
		fmt.Fprintf(GinkgoWriter, "ipamctl gpus:\n%s\n", out)
	})

	// Last: it takes the driver off the node.
	It("rolls back to nv-ipam with a claim's pod as docs/migration.md says: the export refuses the claim, then nothing of the driver is left", func(ctx SpecContext) {
		createClaimPod(ctx, "rb-claim", railClaim(ownerRail))
		got := expectDRAPod(ctx, "rb-claim", ownerRail)
		ip := strings.Split(got.addrs[0], "/")[0]
		image := ipamNodePod(ctx).Spec.Containers[0].Image
		store := filepath.Join(node.StateDir, "store")

		// Step 1 without step 0: the export refuses, names the pod, writes nothing.
		stopNodeDaemon(ctx)
		// Whatever happens, the driver is back for the suite's cleanup (its
		// pods' claims are unprepared by it).
		DeferCleanup(func(ctx SpecContext) {
			Expect(node.Deploy(ctx, harness.RepoRoot(), draOpts)).To(Succeed())
			Expect(node.WaitRollout(ctx, 2*time.Minute)).To(Succeed())
		}, NodeTimeout(3*time.Minute))
		logs, ok := runExportPod(ctx, image)
		Expect(ok).To(BeFalse(), "the export of a store with a claim's address succeeded:\n%s", logs)
		Expect(logs).To(And(ContainSubstring("pod "+ns+"/rb-claim (claim UID"), ContainSubstring(ip), ContainSubstring("--keep-dra-claims")))
		fmt.Fprintf(GinkgoWriter, "the refused export: %s\n", logs)
		head, err := os.ReadFile(store)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(head)).NotTo(HavePrefix("{"), "the refused export wrote nv-ipam's store")

		// Step 0, with the driver back: every pod with a NIC claim goes (this
		// one and docs/dra.md's), the kubelet unprepares, their addresses are
		// released and the ports are back.
		Expect(node.Deploy(ctx, harness.RepoRoot(), draOpts)).To(Succeed())
		Expect(node.WaitRollout(ctx, 2*time.Minute)).To(Succeed())
		deleteDocObjects(ctx)
		deletePod(ctx, "rb-claim")
		Expect(client.IgnoreNotFound(node.Clientset.ResourceV1().ResourceClaims(ns).Delete(ctx, "rb-claim", metav1.DeleteOptions{}))).To(Succeed())
		Eventually(ctx, func(g Gomega) {
			resp, err := nodeInfo.ListAllocations(ctx, &infov1.ListAllocationsRequest{})
			g.Expect(err).NotTo(HaveOccurred())
			for _, a := range resp.GetAllocations() {
				g.Expect(a.GetNetwork()).NotTo(Equal(nicdra.DriverName), "a claim's address is still held: %v", a)
			}
			_, err = netlink.LinkByName(ownerRail)
			g.Expect(err).NotTo(HaveOccurred(), "%s is not back on the host", ownerRail)
		}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		Expect(allocations(ctx)).NotTo(ContainElement(ContainSubstring(" " + ip + " ")))
		before := allocations(ctx)

		// Step 1 as written: the daemon stops, then the document's commands.
		stopNodeDaemon(ctx)
		cmds := docKubectl(filepath.Join(harness.RepoRoot(), "docs", "migration.md"), "nic.hwipam.io")
		Expect(cmds).To(HaveLen(4), "docs/migration.md's DRA commands")
		for _, args := range cmds {
			out, err := node.Kubectl(ctx, args...)
			Expect(err).NotTo(HaveOccurred(), "kubectl %s: %s", strings.Join(args, " "), out)
		}
		_, err = node.Clientset.ResourceV1().DeviceClasses().Get(ctx, nicdra.DriverName, metav1.GetOptions{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "DeviceClass %s: %v", nicdra.DriverName, err)
		_, err = node.Clientset.RbacV1().ClusterRoles().Get(ctx, "hwipam-node-dra", metav1.GetOptions{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "ClusterRole hwipam-node-dra: %v", err)
		for _, vap := range []string{"hwipam-node-own-resourceslices", "hwipam-node-own-claim-status", "hwipam-nic-claims-not-shared"} {
			_, err = node.Clientset.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, vap, metav1.GetOptions{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "ValidatingAdmissionPolicy %s: %v", vap, err)
		}
		left, err := node.Clientset.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + nicdra.DriverName})
		Expect(err).NotTo(HaveOccurred())
		Expect(left.Items).To(BeEmpty(), "the driver's ResourceSlices are left")

		// Step 2: every address is exported, no claim.
		logs, ok = runExportPod(ctx, image)
		Expect(ok).To(BeTrue(), "the export after step 0:\n%s", logs)
		Expect(logs).To(ContainSubstring(fmt.Sprintf("exported %d allocation(s)", len(before))))
		exported, err := os.ReadFile(store)
		Expect(err).NotTo(HaveOccurred())
		var st nvStore
		Expect(json.Unmarshal(exported, &st)).To(Succeed(), string(exported))
		var inStore []string
		for key, p := range st.Pools {
			for _, e := range p.Entries {
				Expect(e.InterfaceName).NotTo(HavePrefix("nic:"), "a claim's entry in the export")
				inStore = append(inStore, fmt.Sprintf("%s %s %s/%s", key, e.IPAddress, e.Metadata.PodNamespace, e.Metadata.PodName))
			}
		}
		slices.Sort(inStore)
		Expect(inStore).To(Equal(before))
		// The suite's cleanup deploys hwipam again, which imports the export.
	})

})

// ownerRail is the rail of the ownership specs.
const ownerRail = "ibp94s0"

// railClaim is a claim spec for the NIC of a rail, under its host name.
func railClaim(rail string) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicdra.DriverName,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes["nic.hwipam.io"].rail == %q`, rail)}}}}}}}}
}

// killIPAMNode kills the ipam-node container (SIGKILL) and waits until it runs again.
func killIPAMNode(ctx context.Context) {
	GinkgoHelper()
	pod := ipamNodePod(ctx)
	Expect(pod.Status.ContainerStatuses).To(HaveLen(1))
	restarts := pod.Status.ContainerStatuses[0].RestartCount
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := execCtr(ctx, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id)
	Expect(err).NotTo(HaveOccurred(), out)
	Eventually(ctx, func(g Gomega) {
		p := ipamNodePod(ctx)
		g.Expect(p.Status.ContainerStatuses[0].RestartCount).To(BeNumerically(">", restarts))
	}).WithTimeout(90 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
}

// scrapeMetrics returns ipam-node's prepare histogram's count and sum.
func scrapeMetrics(ctx context.Context) string {
	GinkgoHelper()
	body := nodeMetrics(ctx)
	var lines []string
	for l := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(l, "hwipam_dra_prepare_duration_seconds_sum") || strings.HasPrefix(l, "hwipam_dra_prepare_duration_seconds_count") ||
			strings.HasPrefix(l, "hwipam_dra_gc_releases_total") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

// nodeMetrics is what ipam-node's metrics endpoint answers now.
func nodeMetrics(ctx context.Context) string {
	GinkgoHelper()
	return httpGet(ctx, "http://"+node.NodeIP.String()+metricsPort(ipamNodePod(ctx), "")+"/metrics")
}

// metricsPort is the ":port" of the pod's --metrics-bind-address, def without one.
func metricsPort(pod *corev1.Pod, def string) string {
	for _, a := range pod.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--metrics-bind-address="); ok {
			def = v
		}
	}
	return def
}

// controllerMetrics is what ipam-controller's metrics endpoint answers now.
func controllerMetrics(ctx context.Context) string {
	GinkgoHelper()
	pods, err := node.Clientset.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=hwipam-controller"})
	Expect(err).NotTo(HaveOccurred())
	Expect(pods.Items).NotTo(BeEmpty())
	pod := &pods.Items[0]
	return httpGet(ctx, "http://"+pod.Status.PodIP+metricsPort(pod, ":8080")+"/metrics")
}

// draPod is what a pod with a nic.hwipam.io claim got.
type draPod struct {
	claim, device, rail, pcieRoot, gpu, ifName string
	addrs                                      []string
}

// expectDRAPod waits for the pod to be ready and checks what it got: its
// claim's nic.hwipam.io device, the device's rail and pool, the address in the
// claim's status from that pool, the netdev in the pod under ifName (the host
// netdev's name when "") with that address, and gone from the host.
func expectDRAPod(ctx SpecContext, name, ifName string) draPod {
	GinkgoHelper()
	pod := waitReady(ctx, name)
	var got draPod
	Expect(pod.Spec.ResourceClaims).To(HaveLen(1))
	if n := pod.Spec.ResourceClaims[0].ResourceClaimName; n != nil {
		got.claim = *n
	} else {
		Expect(pod.Status.ResourceClaimStatuses).To(HaveLen(1))
		got.claim = *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	}
	claim, err := node.Clientset.ResourceV1().ResourceClaims(ns).Get(ctx, got.claim, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	Expect(claim.Status.Allocation).NotTo(BeNil())
	for _, r := range claim.Status.Allocation.Devices.Results {
		switch r.Driver {
		case nicdra.DriverName:
			got.device = r.Device
		case realnode.GPUDriverName:
			got.gpu = r.Device
		}
	}
	var dev resourceapi.Device
	Eventually(ctx, func(g Gomega) {
		for _, d := range nicDevices(ctx, g) {
			if d.Name == got.device {
				dev = d
			}
		}
		g.Expect(dev.Name).To(Equal(got.device))
	}).WithTimeout(10 * time.Second).Should(Succeed())
	got.rail = *dev.Attributes[nicdra.AttrRail].StringValue
	got.pcieRoot = *dev.Attributes["resource.kubernetes.io/pcieRoot"].StringValue
	pool := *dev.Attributes[nicdra.AttrPool].StringValue
	Expect(claim.Status.Devices).To(HaveLen(1), "status %+v", claim.Status.Devices)
	st := claim.Status.Devices[0]
	Expect(st.Driver).To(Equal(nicdra.DriverName))
	Expect(st.NetworkData).NotTo(BeNil())
	got.addrs, got.ifName = st.NetworkData.IPs, st.NetworkData.InterfaceName
	if ifName == "" {
		ifName = got.rail
	}
	Expect(got.ifName).To(Equal(ifName))
	subnet := netip.MustParsePrefix(railSubnet(got.rail))
	Expect(pool).To(Equal("rail-" + got.rail))
	Expect(got.addrs).To(HaveLen(1))
	Expect(subnet.Contains(netip.MustParsePrefix(got.addrs[0]).Addr())).To(BeTrue(), "%s is not in %s", got.addrs[0], subnet)
	// In the pod: the netdev, up, with the address.
	out, err := node.Kubectl(ctx, "-n", ns, "exec", name, "--", "ip", "-o", "addr", "show", "dev", ifName)
	Expect(err).NotTo(HaveOccurred(), "the pod has no %s:\n%s", ifName, out)
	Expect(out).To(ContainSubstring("inet " + got.addrs[0]))
	// Not on the host.
	_, err = netlink.LinkByName(got.rail)
	Expect(err).To(HaveOccurred(), "host link %s is still on the host while %s runs", got.rail, name)
	// The store holds it under the claim's UID.
	Expect(allocations(ctx)).To(ContainElement(ContainSubstring(strings.Split(got.addrs[0], "/")[0])))
	fmt.Fprintf(GinkgoWriter, "%s: claim %s, device %s (rail %s, %s), GPU %q, %s %v\n", name, got.claim, got.device, got.rail,
		got.pcieRoot, got.gpu, ifName, got.addrs)
	return got
}

// nicDevices are the devices of this node's nic.hwipam.io slices, by rail.
func nicDevices(ctx context.Context, g Gomega) map[string]resourceapi.Device {
	l, err := node.Clientset.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + nicdra.DriverName + ",spec.nodeName=" + node.NodeName})
	g.Expect(err).NotTo(HaveOccurred())
	out := map[string]resourceapi.Device{}
	for _, s := range l.Items {
		for _, d := range s.Spec.Devices {
			if r := d.Attributes[nicdra.AttrRail].StringValue; r != nil {
				out[*r] = d
			}
		}
	}
	return out
}

// createClaimPod creates a claim with the spec and a busybox pod that uses it;
// both are deleted when the spec ends.
func createClaimPod(ctx context.Context, name string, spec resourceapi.ResourceClaimSpec) {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	_, err := node.Clientset.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	createPodFor(ctx, name)
}

// createPodFor creates a busybox pod that uses the claim of its name; both are
// deleted when the spec ends.
func createPodFor(ctx context.Context, name string) {
	DeferCleanup(func(ctx SpecContext) {
		deletePod(ctx, name)
		Expect(client.IgnoreNotFound(node.Clientset.ResourceV1().ResourceClaims(ns).Delete(ctx, name, metav1.DeleteOptions{}))).To(Succeed())
	})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: &name}},
			Containers:                    []corev1.Container{{Name: "app", Image: node.BusyboxImage(), Command: []string{"sleep", "1000000"}}},
			TerminationGracePeriodSeconds: new(int64(1)),
		}}
	_, err := node.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
}

// kubectlApply applies one YAML document.
func kubectlApply(ctx context.Context, doc string) {
	GinkgoHelper()
	f := filepath.Join(node.Dir, fmt.Sprintf("apply-%d.yaml", time.Now().UnixNano()))
	Expect(os.WriteFile(f, []byte(doc), 0o644)).To(Succeed())
	out, err := node.Kubectl(ctx, "apply", "-f", f)
	Expect(err).NotTo(HaveOccurred(), "kubectl apply:\n%s\n%s", doc, out)
}

// deleteDocObjects deletes what docs/dra.md's YAML created (but its pools,
// which the spec deletes with its own), pods first.
func deleteDocObjects(ctx SpecContext) {
	for _, p := range []string{"rail-pod", "static-pod", "gpu4-pod", "gpu6-pod"} {
		deletePod(ctx, p)
	}
	for _, doc := range docYAML(filepath.Join(harness.RepoRoot(), "docs", "dra.md")) {
		// The DeviceClass nic.hwipam.io is the overlay's; the docs' others go.
		if strings.Contains(doc, "kind: IPPool") || strings.Contains(doc, "kind: Pod") ||
			(strings.Contains(doc, "kind: DeviceClass") && strings.Contains(doc, "name: "+nicdra.DriverName+"\n")) {
			continue
		}
		f := filepath.Join(node.Dir, "delete.yaml")
		Expect(os.WriteFile(f, []byte(doc), 0o644)).To(Succeed())
		if out, err := node.Kubectl(ctx, "delete", "--ignore-not-found", "-f", f); err != nil && !apierrors.IsNotFound(err) {
			fmt.Fprintf(GinkgoWriter, "deleting %s: %v\n", out, err)
		}
	}
}
