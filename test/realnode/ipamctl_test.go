package realnode_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/test/harness"
)

// ipamctl check, run where an operator runs it: inside the ipam-node pod.
var _ = Describe("ipamctl check in the ipam-node pod", Label("ipamctl"), func() {
	It("says why a pod whose NAD names a missing pool got no address", func(ctx SpecContext) {
		createNAD(ctx, "no-such-pool", macvlanConfig("no-such-pool", "e2e-missing", `"poolType": "ippool"`))
		createPod(ctx, "lost", "no-such-pool")
		DeferCleanup(func(ctx SpecContext) { deletePod(ctx, "lost") })
		pod := ipamNodePod(ctx).Name
		var report ipamctl.CheckReport
		var out string
		Eventually(ctx, func(g Gomega) {
			// Exit code 1 (problems found) makes kubectl exec fail: the report is on stdout.
			out, _ = node.Kubectl(ctx, "-n", "kube-system", "exec", pod, "-c", "ipam-node", "--",
				"/ipamctl", "check", "-o", "json")
			start := strings.IndexByte(out, '{')
			g.Expect(start).To(BeNumerically(">=", 0), out)
			end := strings.LastIndexByte(out, '}')
			g.Expect(json.Unmarshal([]byte(out[start:end+1]), &report)).To(Succeed(), out)
			g.Expect(report.Findings).To(ContainElement(And(
				HaveField("Check", "failure"), HaveField("Subject", "default/lost"),
				HaveField("Message", ContainSubstring("pool e2e-missing) was refused")),
				HaveField("Message", ContainSubstring("NotFound")),
				HaveField("Fix", ContainSubstring("NAD's poolName")))))
		}).WithTimeout(90 * time.Second).WithPolling(3 * time.Second).Should(Succeed())
		Expect(report.Node).To(Equal(node.NodeName))
		// The daemon itself is reported serving, the store consistent, the plugin the
		// one it installed.
		// No error (the run directory's socket path is not the container's, so
		// nv-ipam.conf is only reported; pools other specs left behind hold
		// nothing).
		Expect(report.Errors).To(BeZero(), out)
		for _, check := range []string{"daemon", "store", "plugin"} {
			Expect(report.Findings).To(ContainElement(And(HaveField("Check", check), HaveField("Severity", ipamctl.SeverityOK))),
				"%s:\n%s", check, out)
		}
		for _, args := range [][]string{{"check"}, {"pools"}} {
			out, _ := node.Kubectl(ctx, append([]string{"-n", "kube-system", "exec", pod, "-c", "ipam-node", "--", "/ipamctl"}, args...)...)
			fmt.Fprintf(GinkgoWriter, "ipamctl %s in %s:\n%s\n", strings.Join(args, " "), pod, out)
		}
		// The cluster view, from an admin's kubeconfig (the daemon's service account
		// may not list nodes): the NAD naming no pool is listed.
		var cluster, errOut bytes.Buffer
		Expect(ipamctl.Run(ctx, ipamctl.Options{Args: []string{"pools", "--cluster", "--kubeconfig", node.Kubeconfig},
			Stdout: &cluster, Stderr: &errOut})).To(Succeed(), errOut.String())
		fmt.Fprintf(GinkgoWriter, "ipamctl pools --cluster:\n%s\n", cluster.String())
		// One node selected; with a block, this node and, when the monitoring specs
		// ran first, their Node without a kubelet (deleted, its block kept through
		// the controller's grace period).
		Expect(cluster.String()).To(And(ContainSubstring("NAD without pool: default/no-such-pool names e2e-missing"),
			MatchRegexp(`e2e-a\s+IPPool\s+-\s+10.31.0.0/24\s+1\s+[12]\s+-`)))
	})
})

// ipamctl check with no flags in the ipam-node pod sees the NICs as the daemon
// does: on the demo's deployment (the daemon reads the DGX-H100-like tree through
// --sysfs-root, host links named like its first two rails, a pool per rail
// selecting nic.hwipam.io/<rail>=ib) and on one with a rail map (--rail-config, a
// pool selecting nic.hwipam.io/rail.<name>). Healthy is exit 0; the rail's host
// link set down is exit 1 naming it; set up again, exit 0.
var _ = Describe("ipamctl check with the daemon's view", Label("ipamctl", "ipamctl-view"), Ordered, func() {
	rails := fakesysfs.DGXH100Rails[:2]
	var pools []string
	BeforeAll(func(ctx SpecContext) {
		for i, r := range rails {
			// As the demo does; this spec sets the link down, so it must be its own.
			_, err := netlink.LinkByName(r)
			Expect(err).To(HaveOccurred(), "a host link %s exists already (is `make demo` running?)", r)
			Expect(node.AddVeth(r, fmt.Sprintf("%sv%d", node.Prefix, i))).To(Succeed())
			pools = append(pools, "view-"+r)
			Expect(cl.Create(ctx, &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "view-" + r, Namespace: "kube-system"},
				Spec: v1alpha1.IPPoolSpec{Subnet: fmt.Sprintf("10.%d.0.0/16", 124+i), PerNodeBlockSize: 32,
					Gateway: fmt.Sprintf("10.%d.0.1", 124+i), NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
						MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "nic.hwipam.io/" + r, Operator: corev1.NodeSelectorOpIn,
							Values: []string{"ib"}}}}}}}})).To(Succeed())
		}
		DeferCleanup(func(ctx SpecContext) {
			for _, p := range pools {
				Expect(client.IgnoreNotFound(cl.Delete(ctx, &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: p, Namespace: "kube-system"}}))).To(Succeed())
			}
		})
		for _, p := range pools {
			waitBlock(ctx, p)
		}
		// A fresh daemon: what other specs' pods had refused (the failure check
		// reports the last 15 minutes) is not this spec's.
		_, err := node.Kubectl(ctx, "-n", "kube-system", "rollout", "restart", "daemonset/hwipam-node")
		Expect(err).NotTo(HaveOccurred())
		Expect(node.WaitRollout(ctx, 2*time.Minute)).To(Succeed())
	}, NodeTimeout(5*time.Minute))

	// downAndUp runs check healthy, with the rail's link down, and up again; down
	// is the finding expected while it is down.
	downAndUp := func(ctx SpecContext, link, down string) {
		expectCheck(ctx, 0, "")
		Expect(exec.Command("ip", "link", "set", link, "down").Run()).To(Succeed())
		DeferCleanup(func() { _ = exec.Command("ip", "link", "set", link, "up").Run() })
		expectCheck(ctx, 1, down)
		Expect(exec.Command("ip", "link", "set", link, "up").Run()).To(Succeed())
		expectCheck(ctx, 0, "")
	}

	It("on the demo's deployment", func(ctx SpecContext) {
		downAndUp(ctx, rails[0], fmt.Sprintf("rail NIC %s (0000:18:00.0) is down", rails[0]))
	})

	It("on a deployment with a rail map", func(ctx SpecContext) {
		dir := filepath.Join(node.Dir, "rail-map")
		Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		railMap := filepath.Join(dir, "rails.yaml")
		Expect(os.WriteFile(railMap, []byte(fmt.Sprintf("fabric0: [%s]\nfabric1: [\"0000:40:00.0\"]\n", rails[0])), 0o644)).To(Succeed())
		opts, err := node.BaseOptions()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			Expect(node.Undeploy(ctx)).To(Succeed())
			Expect(node.Redeploy(ctx)).To(Succeed())
		}, NodeTimeout(8*time.Minute))
		Expect(node.Undeploy(ctx)).To(Succeed())
		// deploy/base as it is, under another name so that Redeploy still finds the
		// suite's deploy/base; the map is mounted where the daemon reads it.
		opts.Overlay = "deploy/overlays/no-webhook"
		opts.HostPaths = append(opts.HostPaths, dir)
		opts.NodeArgs = append(opts.NodeArgs, "--rail-config="+railMap)
		Expect(node.Deploy(ctx, harness.RepoRoot(), opts)).To(Succeed())

		pools = append(pools, "view-fabric0")
		Expect(cl.Create(ctx, &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "view-fabric0", Namespace: "kube-system"},
			Spec: v1alpha1.IPPoolSpec{Subnet: "10.126.0.0/16", PerNodeBlockSize: 32, NodeSelector: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: "nic.hwipam.io/rail.fabric0", Operator: corev1.NodeSelectorOpExists}}}}}}})).To(Succeed())
		waitBlock(ctx, "view-fabric0")
		// The pool of rail ibp24s0 by name and the one of rail fabric0 both name the
		// link.
		downAndUp(ctx, rails[0], fmt.Sprintf("rail NIC rail.fabric0 (%s, 0000:18:00.0) is down", rails[0]))
	}, NodeTimeout(12*time.Minute))
})

// expectCheck runs `ipamctl check` with no flags in the ipam-node pod until it
// exits with code (the report settles: a new pool's block, the cleaner), and then
// expects the report to hold want (when set). No run may report a rail NIC missing.
func expectCheck(ctx SpecContext, code int, want string) {
	GinkgoHelper()
	var out string
	Eventually(ctx, func(g Gomega) {
		pod := ipamNodePod(ctx).Name
		var err error
		out, err = node.Kubectl(ctx, "-n", "kube-system", "exec", pod, "-c", "ipam-node", "--", "/ipamctl", "check")
		g.Expect(out).To(MatchRegexp(`(?m)^info\s+view\s+-\s+NICs read from \S+ \(the daemon's\)`), "no view finding, or not the daemon's:\n%s", out)
		Expect(out).NotTo(ContainSubstring("which this node does not have"))
		got := 0
		if err != nil {
			got = -1
			if m := regexp.MustCompile(`command terminated with exit code (\d+)`).FindStringSubmatch(err.Error()); m != nil {
				got, _ = strconv.Atoi(m[1])
			}
		}
		g.Expect(got).To(Equal(code), "ipamctl check in %s:\n%s", pod, out)
		if want != "" {
			g.Expect(out).To(ContainSubstring(want))
		}
	}).WithTimeout(3 * time.Minute).WithPolling(3 * time.Second).Should(Succeed())
	fmt.Fprintf(GinkgoWriter, "ipamctl check (exit %d):\n%s\n", code, out)
}

// waitBlock waits until the pool gives the node a block.
func waitBlock(ctx SpecContext, pool string) {
	GinkgoHelper()
	Eventually(ctx, func(g Gomega) {
		var p v1alpha1.IPPool
		g.Expect(cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: pool}, &p)).To(Succeed())
		g.Expect(p.Status.Allocations).To(ContainElement(HaveField("NodeName", node.NodeName)))
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
}
