package realnode_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
	"github.com/hwipam/hwipam/test/monitoring"
)

// promOperatorVersion is the prometheus-operator release whose PodMonitor and
// PrometheusRule CRDs the monitoring overlay is applied with (fetched through the Go
// module proxy at test time).
const promOperatorVersion = "v0.94.0"

// Issue 46: deploy/overlays/monitoring on the real node. The test scrapes what the
// PodMonitors name (their pods' port, HTTPS, the scraper's token from its Secret)
// and gives what it scraped to promtool as the series of a rule test; then a real
// Prometheus server, configured from the PodMonitors and the PrometheusRule as
// applied, scrapes the daemons itself: a pool driven to exhaustion and a pool with
// more selected nodes than blocks make HwipamNodeBlockFull and
// HwipamPoolSelectedNodesWithoutBlock fire on real values, in both.
var _ = Describe("the monitoring overlay on the node", Label("monitoring"), Ordered, func() {
	BeforeAll(func(ctx SpecContext) {
		for _, f := range promOperatorCRDs(ctx, GinkgoT().TempDir()) {
			out, err := node.Kubectl(ctx, "apply", "--server-side", "-f", f)
			Expect(err).NotTo(HaveOccurred(), out)
		}
		Eventually(ctx, func() error {
			_, err := node.Kubectl(ctx, "get", "podmonitors,prometheusrules", "-A")
			return err
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		swapDeployment(ctx, "deploy/overlays/monitoring")
	}, NodeTimeout(8*time.Minute))

	var scraped map[string]string // job → the scrape's body
	It("serves the daemons' metrics where the PodMonitors say, over HTTPS, to the scraper's token only", func(ctx SpecContext) {
		token := scraperToken(ctx)
		nodeToken := saToken(ctx, "hwipam-node")
		scraped = map[string]string{}
		for _, name := range []string{"hwipam-node", "hwipam-controller"} {
			url := podMonitorURL(ctx, name)
			// Right after the swap the process may not listen yet (Prometheus
			// scrapes again too): the first scrape is retried for a while.
			var code int
			var body string
			Eventually(ctx, func() (err error) {
				code, body, err = tryScrapeHTTPS(ctx, url, token)
				return err
			}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed(), "scraping %s", url)
			Expect(code).To(Equal(http.StatusOK), "%s with the scraper's token: %s", url, body)
			Expect(body).To(ContainSubstring("# TYPE hwipam_"))
			scraped[name] = body
			code, body = scrapeHTTPS(ctx, url, "")
			Expect(code).To(Equal(http.StatusUnauthorized), "%s without a token: %s", url, body)
			code, body = scrapeHTTPS(ctx, url, nodeToken)
			Expect(code).To(Equal(http.StatusForbidden), "%s with ipam-node's own token: %s", url, body)
			fmt.Fprintf(GinkgoWriter, "%s: %s answers the scraper (%d bytes), refuses no token and another token\n", name, url, len(scraped[name]))
		}
	})

	It("makes the exhaustion and no-block alerts fire for pools driven there", func(ctx SpecContext) {
		// mon-tiny: one block of 2 addresses on the node, both taken by pods.
		// mon-one: one block (a /28 has 14 usable addresses) for two selected nodes (this one and a Node object
		// with no kubelet), so one node has none.
		ghost := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "mon-ghost", Labels: map[string]string{"mon": "yes"}}}
		Expect(cl.Create(ctx, ghost)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(cl.Delete(ctx, ghost))).To(Succeed()) })
		_, err := node.Clientset.CoreV1().Nodes().Patch(ctx, node.NodeName, "application/merge-patch+json",
			[]byte(`{"metadata":{"labels":{"mon":"yes"}}}`), metav1.PatchOptions{})
		Expect(err).NotTo(HaveOccurred())
		for _, p := range []v1alpha1.IPPool{
			{ObjectMeta: metav1.ObjectMeta{Name: "mon-tiny", Namespace: "kube-system"},
				Spec: v1alpha1.IPPoolSpec{Subnet: "10.41.0.0/29", PerNodeBlockSize: 2}},
			{ObjectMeta: metav1.ObjectMeta{Name: "mon-one", Namespace: "kube-system"},
				Spec: v1alpha1.IPPoolSpec{Subnet: "10.42.0.0/28", PerNodeBlockSize: 8,
					NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
						{Key: "mon", Operator: corev1.NodeSelectorOpIn, Values: []string{"yes"}}}}}}}},
		} {
			Expect(cl.Create(ctx, &p)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(cl.Delete(ctx, &p))).To(Succeed()) })
		}
		waitBlock(ctx, "mon-tiny")
		createNAD(ctx, "mon-tiny", macvlanConfig("mon-tiny", "mon-tiny", `"poolType": "ippool"`))
		DeferCleanup(func(ctx SpecContext) {
			nads, err := node.NADClient()
			Expect(err).NotTo(HaveOccurred())
			Expect(client.IgnoreNotFound(nads.K8sCniCncfIoV1().NetworkAttachmentDefinitions(ns).Delete(ctx, "mon-tiny",
				metav1.DeleteOptions{}))).To(Succeed())
		})
		// Two pods take the block's addresses (the second waits if the block
		// has one usable address: full either way).
		for _, pod := range []string{"mon-1", "mon-2"} {
			createPod(ctx, pod, "mon-tiny")
		}
		waitReady(ctx, "mon-1")
		token := scraperToken(ctx)
		var series []map[string]any
		without := regexp.MustCompile(`(?m)^hwipam_pool_selected_nodes_without_block\{kind="IPPool",namespace="kube-system",pool="mon-one"\} ([1-9][0-9]*)$`)
		var withoutBlock string // how many, as Prometheus prints it
		Eventually(ctx, func(g Gomega) {
			_, nodeBody := scrapeHTTPS(ctx, podMonitorURL(ctx, "hwipam-node"), token)
			_, ctlBody := scrapeHTTPS(ctx, podMonitorURL(ctx, "hwipam-controller"), token)
			g.Expect(regexp.MustCompile(`(?m)^hwipam_node_pool_free_addresses\{pool="mon-tiny",rail=""\} 0$`).MatchString(nodeBody)).To(BeTrue(),
				"ipam-node's mon-tiny: %q", grepLines(nodeBody, "mon-tiny"))
			m := without.FindStringSubmatch(ctlBody)
			g.Expect(m).NotTo(BeNil(), "ipam-controller's mon-one: %q", grepLines(ctlBody, "mon-one"))
			withoutBlock = m[1]
			series = append(promSeries(nodeBody, map[string]string{"job": "hwipam-node", "node": node.NodeName}, "hwipam_node_pool_"),
				promSeries(ctlBody, map[string]string{"job": "hwipam-controller"}, "hwipam_pool_")...)
		}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())

		groups, err := monitoring.Rules(harness.RepoRoot())
		Expect(err).NotTo(HaveOccurred())
		expect := func(alert string, labels map[string]string, value string) map[string]any {
			r, ok := monitoring.Alert(groups, alert)
			Expect(ok).To(BeTrue(), alert)
			ann := map[string]string{}
			for k, v := range r.Annotations {
				ann[k], err = monitoring.Render(v, labels, value)
				Expect(err).NotTo(HaveOccurred())
			}
			l := map[string]string{"severity": r.Labels["severity"]}
			for k, v := range labels {
				if v != "" { // an empty label is no label
					l[k] = v
				}
			}
			return map[string]any{"eval_time": "10m", "alertname": alert,
				"exp_alerts": []map[string]any{{"exp_labels": l, "exp_annotations": ann}}}
		}
		test := map[string]any{"rule_files": []string{"rules.yaml"}, "evaluation_interval": "1m", "tests": []map[string]any{{
			"interval": "1m", "input_series": series, "alert_rule_test": []map[string]any{
				expect("HwipamNodeBlockFull", map[string]string{"job": "hwipam-node", "node": node.NodeName, "pool": "mon-tiny", "rail": ""}, ""),
				expect("HwipamPoolSelectedNodesWithoutBlock", map[string]string{"job": "hwipam-controller", "kind": "IPPool",
					"namespace": "kube-system", "pool": "mon-one"}, withoutBlock),
			}}}}
		dir := GinkgoT().TempDir()
		rules, err := yaml.Marshal(map[string]any{"groups": groups})
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644)).To(Succeed())
		b, err := yaml.Marshal(test)
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(dir, "live_test.yaml"), b, 0o644)).To(Succeed())
		promtool := os.Getenv("HWIPAM_PROMTOOL")
		Expect(promtool).NotTo(BeEmpty(), "HWIPAM_PROMTOOL: run `make test`")
		cmd := exec.CommandContext(ctx, promtool, "test", "rules", "live_test.yaml")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "promtool test rules on the scraped series:\n%s\n%s", out, b)
		fmt.Fprintf(GinkgoWriter, "promtool on %d scraped series: HwipamNodeBlockFull (mon-tiny) and HwipamPoolSelectedNodesWithoutBlock (mon-one) fire\n%s", len(series), out)

		// The same through a real Prometheus, configured from the PodMonitors
		// and the PrometheusRule as the API server has them: it finds the
		// daemons' pods, scrapes them over HTTPS with the scraper's token, and
		// raises the two alerts (their "for" shortened), for those pools only.
		prom := startPrometheus(ctx, "4s")
		var fired []promAlert
		Eventually(ctx, func(g Gomega) {
			ts, err := prom.targets(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			jobs := map[string]int{}
			for _, t := range ts {
				g.Expect(t.Health).To(Equal("up"), "target %s (%s): %s", t.ScrapeURL, t.ScrapePool, t.LastError)
				jobs[t.Labels["job"]]++
			}
			g.Expect(jobs).To(Equal(map[string]int{"hwipam-node": 1, "hwipam-controller": 1}), "Prometheus's targets: %+v", ts)
			as, err := prom.alerts(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			full, ok := firing(as, "HwipamNodeBlockFull", map[string]string{"job": "hwipam-node", "node": node.NodeName, "pool": "mon-tiny"})
			g.Expect(ok).To(BeTrue(), "HwipamNodeBlockFull for mon-tiny on %s not firing: %+v", node.NodeName, as)
			g.Expect(full.Annotations["summary"]).To(ContainSubstring("Pool mon-tiny has no address left on node " + node.NodeName))
			none, ok := firing(as, "HwipamPoolSelectedNodesWithoutBlock", map[string]string{"kind": "IPPool", "namespace": "kube-system", "pool": "mon-one"})
			g.Expect(ok).To(BeTrue(), "HwipamPoolSelectedNodesWithoutBlock for mon-one not firing: %+v", as)
			g.Expect(none.Annotations["summary"]).To(HavePrefix(withoutBlock + " node(s) selected by IPPool kube-system/mon-one have no block"))
			fired = as
		}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		for _, a := range fired {
			if a.State != "firing" {
				continue
			}
			switch a.Labels["alertname"] {
			case "HwipamNodeBlockFull":
				Expect(a.Labels["pool"]).To(Equal("mon-tiny"), "a block that is not full: %+v", a)
			case "HwipamPoolSelectedNodesWithoutBlock":
				Expect(a.Labels["pool"]).To(Equal("mon-one"), "a pool whose selected nodes all have a block: %+v", a)
			}
			fmt.Fprintf(GinkgoWriter, "Prometheus: %s firing: %s\n", a.Labels["alertname"], a.Annotations["summary"])
		}
	})
})

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// promOperatorCRDs writes prometheus-operator's PodMonitor and PrometheusRule CRDs
// (from its module at promOperatorVersion) into dir.
func promOperatorCRDs(ctx context.Context, dir string) []string {
	modDir := moduleDir(ctx, "github.com/prometheus-operator/prometheus-operator@"+promOperatorVersion)
	var files []string
	for _, kind := range []string{"podmonitors", "prometheusrules"} {
		data, err := os.ReadFile(filepath.Join(modDir, "example", "prometheus-operator-crd", "monitoring.coreos.com_"+kind+".yaml"))
		Expect(err).NotTo(HaveOccurred())
		file := filepath.Join(dir, kind+".yaml")
		Expect(os.WriteFile(file, data, 0o644)).To(Succeed())
		files = append(files, file)
	}
	return files
}

// scraperToken is the token in the Secret the PodMonitors take theirs from, once
// kube-controller-manager has filled it.
func scraperToken(ctx context.Context) string {
	GinkgoHelper()
	var token string
	Eventually(ctx, func(g Gomega) {
		s, err := node.Clientset.CoreV1().Secrets("kube-system").Get(ctx, "hwipam-metrics-scraper-token", metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		token = string(s.Data["token"])
		g.Expect(token).NotTo(BeEmpty())
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	return token
}

// saToken is a token of a kube-system service account.
func saToken(ctx context.Context, sa string) string {
	GinkgoHelper()
	tr, err := node.Clientset.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(600))}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// podMonitorURL is where the PodMonitor named name scrapes: its pods' (by its
// selector) container port of its endpoint's port name, with its scheme.
func podMonitorURL(ctx context.Context, name string) string {
	GinkgoHelper()
	out, err := node.Kubectl(ctx, "-n", "kube-system", "get", "podmonitor", name, "-o", "json")
	Expect(err).NotTo(HaveOccurred(), out)
	var pm podMonitor
	Expect(json.Unmarshal([]byte(out), &pm)).To(Succeed())
	Expect(pm.Spec.Endpoints).To(HaveLen(1))
	ep := pm.Spec.Endpoints[0]
	var sel []string
	for k, v := range pm.Spec.Selector.MatchLabels {
		sel = append(sel, k+"="+v)
	}
	pods, err := node.Clientset.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: strings.Join(sel, ",")})
	Expect(err).NotTo(HaveOccurred())
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
			continue
		}
		for _, c := range p.Spec.Containers {
			for _, port := range c.Ports {
				if port.Name == ep.Port {
					path := ep.Path
					if path == "" {
						path = "/metrics"
					}
					return fmt.Sprintf("%s://%s:%d%s", ep.Scheme, p.Status.PodIP, port.ContainerPort, path)
				}
			}
		}
	}
	Fail(fmt.Sprintf("PodMonitor %s: no running pod with port %s among %d", name, ep.Port, len(pods.Items)))
	return ""
}

// scrapeHTTPS gets url as the PodMonitors do: TLS without verifying the daemon's
// self-signed certificate, the token as bearer ("" for none).
func scrapeHTTPS(ctx context.Context, url, token string) (int, string) {
	GinkgoHelper()
	code, body, err := tryScrapeHTTPS(ctx, url, token)
	Expect(err).NotTo(HaveOccurred())
	return code, body
}

// tryScrapeHTTPS is scrapeHTTPS, with an error where the request failed.
func tryScrapeHTTPS(ctx context.Context, url, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// promSeries turns a scrape's samples of metrics named with prefix into promtool
// input series, constant for 30 minutes, with extra labels (the scrape's target).
func promSeries(body string, extra map[string]string, prefix string) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			continue
		}
		sel := l[:i]
		var keys []string
		for k := range extra {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var add []string
		for _, k := range keys {
			add = append(add, fmt.Sprintf("%s=%q", k, extra[k]))
		}
		if strings.HasSuffix(sel, "}") {
			sel = strings.TrimSuffix(sel, "}") + "," + strings.Join(add, ",") + "}"
		} else {
			sel += "{" + strings.Join(add, ",") + "}"
		}
		out = append(out, map[string]any{"series": sel, "values": strconv.FormatFloat(v, 'g', -1, 64) + "x30"})
	}
	return out
}
