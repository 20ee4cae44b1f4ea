package realnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/test/monitoring"
)

// A real Prometheus server (built from the Go module proxy with promtool, see
// hack/test-assets.sh), configured from what deploy/monitoring applied: each
// PodMonitor becomes a scrape job that finds its pods through the API server
// (Kubernetes service discovery, role pod) and scrapes them as
// prometheus-operator would (its selector, port, scheme, TLS, the token from
// its Secret, its relabelings, job from jobLabel), and the PrometheusRule's
// groups are its rule file. Nothing is copied from the operator: the few
// relabelings it generates for a PodMonitor are written out here.

// promServer is a running Prometheus and where its API answers.
type promServer struct {
	url string
}

// podMonitor is the part of a PodMonitor this test turns into a scrape job.
type podMonitor struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		JobLabel string `json:"jobLabel"`
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Scheme        string `json:"scheme"`
			Path          string `json:"path"`
			Authorization struct {
				Type        string `json:"type"`
				Credentials struct {
					Name string `json:"name"`
					Key  string `json:"key"`
				} `json:"credentials"`
			} `json:"authorization"`
			TLSConfig struct {
				InsecureSkipVerify bool `json:"insecureSkipVerify"`
			} `json:"tlsConfig"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
				Regex        string   `json:"regex"`
				Replacement  *string  `json:"replacement"`
				Action       string   `json:"action"`
			} `json:"relabelings"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// labelName is a Kubernetes label key as service discovery names it
// (__meta_kubernetes_pod_label_<key with every other character as _>).
var notLabelChar = regexp.MustCompile(`[^a-zA-Z0-9_]`)

func labelName(key string) string { return notLabelChar.ReplaceAllString(key, "_") }

// scrapeJobs turns the namespace's PodMonitors into Prometheus scrape
// configs, every interval; a Secret a PodMonitor takes its token from is
// written into dir and named as the job's credentials file.
func scrapeJobs(ctx context.Context, dir, namespace, interval string) []map[string]any {
	GinkgoHelper()
	out, err := node.Kubectl(ctx, "-n", namespace, "get", "podmonitors", "-o", "json")
	Expect(err).NotTo(HaveOccurred(), out)
	var list struct {
		Items []podMonitor `json:"items"`
	}
	Expect(json.Unmarshal([]byte(out), &list)).To(Succeed())
	Expect(list.Items).NotTo(BeEmpty(), "no PodMonitor in %s", namespace)
	var jobs []map[string]any
	for _, pm := range list.Items {
		for i, ep := range pm.Spec.Endpoints {
			relabel := []map[string]any{
				// Pods that have finished are not scraped.
				{"source_labels": []string{"__meta_kubernetes_pod_phase"}, "regex": "(Failed|Succeeded)", "action": "drop"},
				{"source_labels": []string{"__meta_kubernetes_pod_container_port_name"}, "regex": ep.Port, "action": "keep"},
			}
			for k, v := range pm.Spec.Selector.MatchLabels {
				relabel = append(relabel, map[string]any{"source_labels": []string{"__meta_kubernetes_pod_label_" + labelName(k)},
					"regex": regexp.QuoteMeta(v), "action": "keep"})
			}
			if pm.Spec.JobLabel != "" {
				relabel = append(relabel, map[string]any{"source_labels": []string{"__meta_kubernetes_pod_label_" + labelName(pm.Spec.JobLabel)},
					"target_label": "job"})
			}
			for _, r := range ep.Relabelings {
				m := map[string]any{"source_labels": r.SourceLabels, "target_label": r.TargetLabel}
				if r.Regex != "" {
					m["regex"] = r.Regex
				}
				if r.Replacement != nil {
					m["replacement"] = *r.Replacement
				}
				if r.Action != "" {
					m["action"] = strings.ToLower(r.Action)
				}
				relabel = append(relabel, m)
			}
			job := map[string]any{
				"job_name":        fmt.Sprintf("podMonitor/%s/%s/%d", pm.Metadata.Namespace, pm.Metadata.Name, i),
				"scrape_interval": interval,
				"scheme":          ep.Scheme,
				"kubernetes_sd_configs": []map[string]any{{"role": "pod", "kubeconfig_file": node.Kubeconfig,
					"namespaces": map[string]any{"names": []string{pm.Metadata.Namespace}}}},
				"tls_config":      map[string]any{"insecure_skip_verify": ep.TLSConfig.InsecureSkipVerify},
				"relabel_configs": relabel,
			}
			if ep.Path != "" {
				job["metrics_path"] = ep.Path
			}
			if c := ep.Authorization.Credentials; c.Name != "" {
				s, err := node.Clientset.CoreV1().Secrets(pm.Metadata.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
				Expect(err).NotTo(HaveOccurred())
				Expect(s.Data[c.Key]).NotTo(BeEmpty(), "Secret %s/%s has no %s yet", pm.Metadata.Namespace, c.Name, c.Key)
				file := filepath.Join(dir, pm.Metadata.Name+"-"+c.Name)
				Expect(os.WriteFile(file, s.Data[c.Key], 0o600)).To(Succeed())
				typ := ep.Authorization.Type
				if typ == "" {
					typ = "Bearer"
				}
				job["authorization"] = map[string]any{"type": typ, "credentials_file": file}
			}
			jobs = append(jobs, job)
		}
	}
	return jobs
}

// startPrometheus runs the real Prometheus server with the PodMonitors of
// kube-system as its scrape jobs and the PrometheusRules there as its rules,
// every "for" shortened to forDur (what is proven is that the expressions
// become true on what it scraped, and that the alerts carry their labels and
// annotations; the durations are promtool's tests' subject). It is stopped
// when the spec ends.
func startPrometheus(ctx context.Context, forDur string) *promServer {
	GinkgoHelper()
	bin := os.Getenv("HWIPAM_PROMETHEUS")
	Expect(bin).NotTo(BeEmpty(), "HWIPAM_PROMETHEUS is not set: run `make test`, or `eval \"$(hack/test-assets.sh env)\"` first")
	dir := GinkgoT().TempDir()
	out, err := node.Kubectl(ctx, "-n", "kube-system", "get", "prometheusrules", "-o", "json")
	Expect(err).NotTo(HaveOccurred(), out)
	var rules struct {
		Items []struct {
			Spec struct {
				Groups []monitoring.Group `json:"groups"`
			} `json:"spec"`
		} `json:"items"`
	}
	Expect(json.Unmarshal([]byte(out), &rules)).To(Succeed())
	var groups []monitoring.Group
	for _, pr := range rules.Items {
		for _, g := range pr.Spec.Groups {
			for i := range g.Rules {
				if g.Rules[i].For != "" {
					g.Rules[i].For = forDur
				}
			}
			groups = append(groups, g)
		}
	}
	Expect(groups).NotTo(BeEmpty(), "no PrometheusRule groups in kube-system")
	b, err := yaml.Marshal(map[string]any{"groups": groups})
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(filepath.Join(dir, "rules.yaml"), b, 0o644)).To(Succeed())
	cfg := map[string]any{
		"global":         map[string]any{"scrape_interval": "2s", "evaluation_interval": "2s"},
		"rule_files":     []string{filepath.Join(dir, "rules.yaml")},
		"scrape_configs": scrapeJobs(ctx, dir, "kube-system", "2s"),
	}
	b, err = yaml.Marshal(cfg)
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(filepath.Join(dir, "prometheus.yml"), b, 0o644)).To(Succeed())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	addr := l.Addr().String()
	Expect(l.Close()).To(Succeed())
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	Expect(err).NotTo(HaveOccurred())
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	Expect(cmd.Start()).To(Succeed())
	DeferCleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
		if CurrentSpecReport().Failed() {
			b, _ := os.ReadFile(logf.Name())
			fmt.Fprintf(GinkgoWriter, "Prometheus's log:\n%s\n", b)
		}
	})
	p := &promServer{url: "http://" + addr}
	Eventually(ctx, func() error {
		_, err := p.get(ctx, "/-/ready")
		return err
	}).WithTimeout(time.Minute).WithPolling(500*time.Millisecond).Should(Succeed(), "Prometheus ready at %s", p.url)
	fmt.Fprintf(GinkgoWriter, "Prometheus at %s: %d scrape jobs from the PodMonitors, %d rule groups\n", p.url,
		len(cfg["scrape_configs"].([]map[string]any)), len(groups))
	return p
}

// get returns the body of a 200 answer to path, an error otherwise.
func (p *promServer) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path, http.NoBody)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s: %s", path, resp.Status, b)
	}
	return b, err
}

// promTarget is one active target of /api/v1/targets.
type promTarget struct {
	Labels     map[string]string `json:"labels"`
	ScrapeURL  string            `json:"scrapeUrl"`
	Health     string            `json:"health"`
	LastError  string            `json:"lastError"`
	ScrapePool string            `json:"scrapePool"`
}

// targets are Prometheus's active targets.
func (p *promServer) targets(ctx context.Context) ([]promTarget, error) {
	d, err := apiData[struct {
		ActiveTargets []promTarget `json:"activeTargets"`
	}](ctx, p, "/api/v1/targets?state=active")
	return d.ActiveTargets, err
}

// apiData is the data of Prometheus's API's answer to path.
func apiData[T any](ctx context.Context, p *promServer, path string) (T, error) {
	var r struct {
		Data T `json:"data"`
	}
	b, err := p.get(ctx, path)
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	return r.Data, err
}

// promAlert is one alert of /api/v1/alerts.
type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	Value       string            `json:"value"`
}

// alerts are Prometheus's pending and firing alerts.
func (p *promServer) alerts(ctx context.Context) ([]promAlert, error) {
	d, err := apiData[struct {
		Alerts []promAlert `json:"alerts"`
	}](ctx, p, "/api/v1/alerts")
	return d.Alerts, err
}

// firing finds the firing alert of that name whose labels include want.
func firing(alerts []promAlert, name string, want map[string]string) (promAlert, bool) {
	for _, a := range alerts {
		if a.Labels["alertname"] != name || a.State != "firing" {
			continue
		}
		match := true
		for k, v := range want {
			if a.Labels[k] != v {
				match = false
			}
		}
		if match {
			return a, true
		}
	}
	return promAlert{}, false
}
