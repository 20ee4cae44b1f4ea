package monitoring_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/test/harness"
	"github.com/hwipam/hwipam/test/monitoring"
)

// promtool is the promtool test-assets built (make test-assets).
func promtool(t *testing.T) string {
	t.Helper()
	p := os.Getenv("HWIPAM_PROMTOOL")
	if p == "" {
		t.Fatal("HWIPAM_PROMTOOL is not set: run `make test`, or `eval \"$(hack/test-assets.sh env)\"` before `go test`")
	}
	return p
}

// rulesFile writes the PrometheusRule's groups as a Prometheus rule file in
// dir, and alerts_test.yaml beside it.
func rulesFile(t *testing.T, dir string) {
	t.Helper()
	groups, err := monitoring.Rules(harness.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The alerting rules pass `promtool check rules` and their unit tests
// (alerts_test.yaml): each alert fires with its labels and rendered summary,
// description and runbook where it should, and stays quiet where it should not.
func TestAlertsWithPromtool(t *testing.T) {
	bin := promtool(t)
	dir := t.TempDir()
	rulesFile(t, dir)
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// Every alert has a case that fires and one that stays quiet; every summary
// says what to run first, in backquotes; every runbook is a section of
// docs/troubleshooting.md.
func TestEveryAlertIsTestedAndHasARunbook(t *testing.T) {
	groups, err := monitoring.Rules(harness.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cases struct {
		Tests []struct {
			Name  string `json:"name"`
			Tests []struct {
				Alert string `json:"alertname"`
				Exp   []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	firing, quiet := map[string]int{}, map[string]int{}
	for _, c := range cases.Tests {
		for _, at := range c.Tests {
			if len(at.Exp) > 0 {
				firing[at.Alert]++
			} else {
				quiet[at.Alert]++
			}
		}
	}
	doc, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	var anchors []string
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors = append(anchors, strings.ToLower(strings.ReplaceAll(strings.Trim(m[1], "`"), " ", "-")))
	}
	const runbooks = "https://github.com/hwipam/hwipam/blob/main/docs/troubleshooting.md#"
	alerts := 0
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if firing[r.Alert] == 0 || quiet[r.Alert] == 0 {
				t.Errorf("alert %s: %d firing and %d quiet cases in alerts_test.yaml, want one of each at least", r.Alert,
					firing[r.Alert], quiet[r.Alert])
			}
			if !regexp.MustCompile("`[a-z]+ [^`]*`").MatchString(r.Annotations["summary"]) {
				t.Errorf("alert %s: its summary names no command to run first: %q", r.Alert, r.Annotations["summary"])
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbooks)
			if !ok || !slices.Contains(anchors, anchor) {
				t.Errorf("alert %s: runbook %q is not a section of docs/troubleshooting.md", r.Alert, r.Annotations["runbook_url"])
			}
			if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" && sev != "info" {
				t.Errorf("alert %s: severity %q", r.Alert, sev)
			}
		}
	}
	if alerts < 15 {
		t.Errorf("%d alerts, want the 15 or more the issue lists", alerts)
	}
}

// The dashboard parses, and every metric its queries name is one the source
// defines or a recording rule of the PrometheusRule (the real-node suite checks
// them against what the running daemons export).
func TestDashboardNamesKnownMetrics(t *testing.T) {
	root := harness.RepoRoot()
	d, err := monitoring.ReadDashboard(root)
	if err != nil {
		t.Fatal(err)
	}
	if d.UID != "hwipam" || len(d.Panels) < 10 {
		t.Errorf("dashboard %q with %d panels", d.UID, len(d.Panels))
	}
	groups, err := monitoring.Rules(root)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{"up": true}
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				known[r.Record] = true
			}
		}
	}
	// The metric names the Go source registers.
	out, err := exec.Command("grep", "-rhoE", `"hwipam_[a-z0-9_]+"`, "--include=*.go", filepath.Join(root, "pkg")).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Fields(string(out)) {
		known[strings.Trim(l, `"`)] = true
	}
	names := monitoring.MetricNames(d.Queries()...)
	for _, g := range groups {
		for _, r := range g.Rules {
			names = append(names, monitoring.MetricNames(r.Expr)...)
		}
	}
	for _, n := range names {
		if !monitoring.Exported(n, known) && !strings.Contains(n, ":") {
			t.Errorf("the dashboard or the rules name %s, which no binary defines", n)
		} else if strings.Contains(n, ":") && !known[n] {
			t.Errorf("the dashboard names %s, which no recording rule defines", n)
		}
	}
}
