package realnode_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/hwipam/hwipam/pkg/ipamctl"
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
		Expect(cluster.String()).To(And(ContainSubstring("NAD without pool: default/no-such-pool names e2e-missing"),
			MatchRegexp(`e2e-a\s+IPPool\s+10.31.0.0/24\s+1\s+1\s+-`)))
	})
})
