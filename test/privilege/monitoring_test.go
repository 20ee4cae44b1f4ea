package privilege

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hwipam/hwipam/pkg/daemon"
)

const monitoringOverlay = "deploy/overlays/monitoring"

// TestMonitoringOverlayRenders renders deploy/overlays/monitoring with the real
// kubectl: the base, plus the PodMonitors (HTTPS, the scraper's token, the node
// label), the PrometheusRule, the dashboard's ConfigMap for Grafana's sidecar, the
// scraper's identity and the reviews the daemons need; both daemons serve their
// metrics with --metrics-secure, ipam-node on a port named metrics.
func TestMonitoringOverlayRenders(t *testing.T) {
	base, mon := render(t, "deploy/base"), render(t, monitoringOverlay)
	baseKeys := map[string]bool{}
	for _, o := range base {
		baseKeys[o.GetKind()+"/"+o.GetName()] = true
	}
	var added []string
	for _, o := range mon {
		if !baseKeys[o.GetKind()+"/"+o.GetName()] {
			added = append(added, o.GetKind()+"/"+o.GetName())
		}
	}
	slices.Sort(added)
	want := []string{"ClusterRole/hwipam-metrics-auth", "ClusterRole/hwipam-metrics-reader", "ClusterRoleBinding/hwipam-metrics-auth",
		"ClusterRoleBinding/hwipam-metrics-reader", "ConfigMap/hwipam-dashboard", "PodMonitor/hwipam-controller", "PodMonitor/hwipam-node",
		"PrometheusRule/hwipam", "Secret/hwipam-metrics-scraper-token", "ServiceAccount/hwipam-metrics-scraper"}
	if !slices.Equal(added, want) {
		t.Errorf("the overlay adds %v, want %v", added, want)
	}
	for _, o := range mon {
		switch o.GetKind() + "/" + o.GetName() {
		case "ConfigMap/hwipam-dashboard":
			if o.GetLabels()["grafana_dashboard"] != "1" {
				t.Errorf("the dashboard's ConfigMap lacks grafana_dashboard: %v", o.GetLabels())
			}
		case "PodMonitor/hwipam-node":
			eps, _, _ := unstructuredSlice(o.Object, "spec", "podMetricsEndpoints")
			if len(eps) != 1 {
				t.Fatalf("PodMonitor hwipam-node endpoints %v", eps)
			}
			ep := eps[0].(map[string]any)
			if ep["scheme"] != "https" || ep["port"] != "metrics" || !strings.Contains(fmt.Sprint(ep["authorization"]), "hwipam-metrics-scraper-token") ||
				!strings.Contains(fmt.Sprint(ep["relabelings"]), "__meta_kubernetes_pod_node_name") {
				t.Errorf("PodMonitor hwipam-node endpoint %v: want https on port metrics with the scraper's token and the node label", ep)
			}
		case "DaemonSet/hwipam-node":
			var ds appsv1.DaemonSet
			fromUnstructured(t, o, &ds)
			c := ds.Spec.Template.Spec.Containers[0]
			if !slices.Contains(c.Args, "--metrics-secure=true") || len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != 18080 {
				t.Errorf("ipam-node: args %q, ports %+v; want --metrics-secure=true and port metrics 18080", c.Args, c.Ports)
			}
		case "Deployment/hwipam-controller":
			var d appsv1.Deployment
			fromUnstructured(t, o, &d)
			if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--metrics-secure=true") {
				t.Errorf("ipam-controller args %q: want --metrics-secure=true", d.Spec.Template.Spec.Containers[0].Args)
			}
		}
	}
}

func unstructuredSlice(obj map[string]any, fields ...string) ([]any, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = m[f]
	}
	s, ok := cur.([]any)
	return s, ok, nil
}

// TestMetricsOnlyToTheScraper: with the monitoring overlay's rights, a metrics
// endpoint served as the daemons serve it with --metrics-secure (HTTPS, each
// token reviewed by the API server with the daemon's own identity) answers the
// scraper's token, and refuses a token without the right (the node daemon's
// own), a token the API server does not know, and no token.
func TestMetricsOnlyToTheScraper(t *testing.T) {
	e := startEnvOf(t, monitoringOverlay, 3)
	nodeToken := e.token(t, nil)
	for _, who := range []struct{ name, token string }{{"ipam-node", nodeToken},
		{"ipam-controller", e.tokenFor(t, "hwipam-controller", nil)}} {
		t.Run("served by "+who.name, func(t *testing.T) {
			addr := serveMetrics(t, e.as(who.token))
			for _, c := range []struct {
				name, token string
				want        int
			}{
				{"the scraper", e.tokenFor(t, "hwipam-metrics-scraper", nil), http.StatusOK},
				{"the node daemon's token", nodeToken, http.StatusForbidden},
				{"an unknown token", "not-a-token", http.StatusUnauthorized},
				{"no token", "", http.StatusUnauthorized},
			} {
				code, body := scrapeTLS(t, addr, c.token)
				if code != c.want {
					t.Errorf("%s: %d %q, want %d", c.name, code, body, c.want)
				}
				if c.want == http.StatusOK && !strings.Contains(body, "# TYPE") {
					t.Errorf("%s: the answer is no metrics: %q", c.name, body)
				}
			}
		})
	}
}

// serveMetrics starts controller-runtime's metrics server as a daemon with
// --metrics-secure does, authenticating to the API server with cfg.
func serveMetrics(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := metricsserver.NewServer(daemon.MetricsOptions(addr, true), cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err == nil {
			_ = c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("the metrics server does not serve TLS on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func scrapeTLS(t *testing.T, addr, token string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
