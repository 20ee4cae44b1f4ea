// Package monitoring reads deploy/monitoring (the alerting rules and the Grafana
// dashboard) for the tests that check them: promtool's unit tests here, and the
// real-node suite, which scrapes the real daemons and checks that every metric the
// dashboard and the rules name is one they export.
package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// Rule is one rule of the PrometheusRule.
type Rule struct {
	Record      string            `json:"record,omitempty"`
	Alert       string            `json:"alert,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Group is a rule group, as Prometheus's rule files and the PrometheusRule's
// spec have them.
type Group struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

// Rules reads the PrometheusRule's groups under root (the repository).
func Rules(root string) ([]Group, error) {
	b, err := os.ReadFile(filepath.Join(root, "deploy", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		return nil, err
	}
	var pr struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       struct {
			Groups []Group `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(b, &pr); err != nil {
		return nil, fmt.Errorf("prometheusrule.yaml: %w", err)
	}
	if pr.Kind != "PrometheusRule" || len(pr.Spec.Groups) == 0 {
		return nil, fmt.Errorf("prometheusrule.yaml: kind %q with %d groups, want a PrometheusRule with groups", pr.Kind, len(pr.Spec.Groups))
	}
	return pr.Spec.Groups, nil
}

// Dashboard is the part of the Grafana dashboard the tests read.
type Dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// Panel is one panel and its queries.
type Panel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// ReadDashboard reads deploy/monitoring/dashboard.json under root.
func ReadDashboard(root string) (*Dashboard, error) {
	b, err := os.ReadFile(filepath.Join(root, "deploy", "monitoring", "dashboard.json"))
	if err != nil {
		return nil, err
	}
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("dashboard.json: %w", err)
	}
	return &d, nil
}

// Queries returns every PromQL query of the dashboard: its panels' and its
// variables'.
func (d *Dashboard) Queries() []string {
	var out []string
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			out = append(out, t.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			if s, ok := q["query"].(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

var (
	metricName    = regexp.MustCompile(`\b(hwipam[a-z0-9_:]*|up)\b`)
	stringLiteral = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
)

// histogramSuffixes are what a histogram's series add to its name.
var histogramSuffixes = []string{"_bucket", "_count", "_sum"}

// MetricNames returns the metric names the queries name, sorted, each once:
// hwipam's (a histogram's series by the histogram's name) and recording rules'
// (hwipam:...), and up.
func MetricNames(queries ...string) []string {
	var out []string
	for _, q := range queries {
		for _, m := range metricName.FindAllString(stringLiteral.ReplaceAllString(q, `""`), -1) {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Exported says whether name is among the metric families a scrape gave
// (families: their names as "# TYPE" lines give them), a histogram's
// suffixed series included.
func Exported(name string, families map[string]bool) bool {
	if families[name] {
		return true
	}
	for _, s := range histogramSuffixes {
		if base, ok := strings.CutSuffix(name, s); ok && families[base] {
			return true
		}
	}
	return false
}

// Families returns the metric families of a scrape in Prometheus's text format,
// by their "# TYPE" lines.
func Families(scrape string) map[string]bool {
	out := map[string]bool{}
	for _, l := range strings.Split(scrape, "\n") {
		if rest, ok := strings.CutPrefix(l, "# TYPE "); ok {
			if name, _, ok := strings.Cut(rest, " "); ok {
				out[name] = true
			}
		}
	}
	return out
}

// Render fills an alert annotation's template as Prometheus does for the
// templates the rules use: {{ $labels.<name> }} and a plain {{ $value }}
// (given as it prints). A template with any other part is an error.
func Render(tmpl string, labels map[string]string, value string) (string, error) {
	out := regexp.MustCompile(`\{\{ \$labels\.([a-z_]+) \}\}`).ReplaceAllStringFunc(tmpl, func(m string) string {
		return labels[strings.TrimSuffix(strings.TrimPrefix(m, "{{ $labels."), " }}")]
	})
	out = strings.ReplaceAll(out, "{{ $value }}", value)
	if strings.Contains(out, "{{") {
		return "", fmt.Errorf("template %q has parts Render does not fill", tmpl)
	}
	return out, nil
}

// Alert returns the alerting rule named name.
func Alert(groups []Group, name string) (Rule, bool) {
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return r, true
			}
		}
	}
	return Rule{}, false
}
