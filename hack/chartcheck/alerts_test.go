package chartcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// renderedAlert is an alert of the chart's PrometheusRule.
type renderedAlert struct {
	Alert       string            `json:"alert"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// renderedAlerts are the alerts the chart's PrometheusRule renders.
func renderedAlerts(t *testing.T) []renderedAlert {
	t.Helper()
	out := render(t, "--set", "prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml")
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []renderedAlert `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &rule); err != nil {
		t.Fatal(err)
	}
	var alerts []renderedAlert
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r)
			}
		}
	}
	if len(alerts) == 0 {
		t.Fatal("the chart's PrometheusRule rendered no alert")
	}
	return alerts
}

// alertNames are the names of alerts.
func alertNames(alerts []renderedAlert) []string {
	var names []string
	for _, a := range alerts {
		names = append(names, a.Alert)
	}
	return names
}

// TestAlertsTableIsTheChartsAlerts: docs/alerts.md's runbook table has one row per alert the
// chart renders, no other, and each row says when it fires and what to do in words (a row of
// the e2e timings pasted over it, "12.8 s", says neither).
func TestAlertsTableIsTheChartsAlerts(t *testing.T) {
	rendered := renderedAlerts(t)
	alerts := alertNames(rendered)
	severity := map[string]string{}
	for _, a := range rendered {
		severity[a.Alert] = a.Labels["severity"]
	}
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "alerts.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "| alert | severity | fires when | what to do |")
	if start < 0 {
		t.Fatal(`docs/alerts.md has no runbook table ("| alert | severity | fires when | what to do |")`)
	}
	var rows []string
	// Each row opens with the anchor its alert's runbook_url names.
	first := regexp.MustCompile("^\\| <a id=\"([a-z]+)\"></a>`(\\w+)`$")
	for _, line := range strings.Split(doc[start:], "\n")[2:] {
		if !strings.HasPrefix(line, "| ") {
			break
		}
		cells := strings.Split(line, " | ")
		m := first.FindStringSubmatch(cells[0])
		if m == nil {
			t.Errorf("docs/alerts.md: a row opens with %q, not an anchor and an alert's name", cells[0])
			continue
		}
		name := m[2]
		if m[1] != strings.ToLower(name) {
			t.Errorf("docs/alerts.md: the row of %s has the anchor %q, want %q", name, m[1], strings.ToLower(name))
		}
		rows = append(rows, name)
		if len(cells) != 4 {
			t.Errorf("docs/alerts.md: the row of %s has %d cells, want 4", name, len(cells))
			continue
		}
		if want, ok := severity[name]; ok && cells[1] != want {
			t.Errorf("docs/alerts.md: the row of %s says severity %s, the chart renders %s", name, cells[1], want)
		}
		for _, c := range cells[2:] {
			if len(strings.Fields(c)) < 8 {
				t.Errorf("docs/alerts.md: the row of %s says %q: not when it fires and what to do", name, strings.TrimSuffix(c, " |"))
			}
		}
	}
	for _, a := range alerts {
		if !slices.Contains(rows, a) {
			t.Errorf("docs/alerts.md's runbook table has no row for %s", a)
		}
	}
	for _, r := range rows {
		if !slices.Contains(alerts, r) {
			t.Errorf("docs/alerts.md's runbook table has a row for %s, which the chart does not render", r)
		}
	}
}

// TestNoDocTypesACount: a count typed into a document goes stale with the next alert (three
// places said "seven" when there were fourteen), flag, panel or reason; documents name
// where the list is instead (docs/alerts.md, docs/flags.md, docs/decisions.md), whose tables
// tests generate or check.
func TestNoDocTypesACount(t *testing.T) {
	count := regexp.MustCompile(`(?i)\b(\d+|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|twenty)\s+` +
		`(alerts|flags|panels|recording rules|reason codes|admission reasons|decision series)\b`)
	root := testenv.RepoRoot()
	rels := []string{"README.md", "charts/exit-guard/Chart.yaml", "charts/exit-guard/CHANGELOG.md", "charts/exit-guard/README.md",
		"charts/exit-guard/README.md.gotmpl", "charts/exit-guard/templates/NOTES.txt"}
	// Every user doc and evidence report too.
	for _, pattern := range []string{"docs/*.md", "docs/evidence/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil || len(m) == 0 {
			t.Fatalf("no documents match %s: %v", pattern, err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			rels = append(rels, rel)
		}
	}
	for _, rel := range rels {
		raw, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range count.FindAllString(string(raw), -1) {
			t.Errorf("%s counts what a list holds (%q): name the list instead (docs/alerts.md, docs/flags.md, docs/decisions.md), whose tables tests check", rel, m)
		}
	}
}

// TestEveryAlertHasARunbook: each alert's runbook_url is its section of docs/runbooks.md
// (prometheusRule.runbookBaseURL, then the heading's anchor), and that section is a runbook in
// the usual form: meaning, impact, diagnosis, mitigation, escalation. A section for an alert
// the chart does not render fails too.
func TestEveryAlertHasARunbook(t *testing.T) {
	const base = "https://github.com/exit-guard/exit-guard/blob/main/docs/runbooks.md"
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	parts := regexp.MustCompile(`(?m)^## `).Split(string(raw), -1)
	for _, p := range parts[1:] {
		name, body, _ := strings.Cut(p, "\n")
		sections[strings.TrimSpace(name)] = body
	}
	alerts := renderedAlerts(t)
	for _, a := range alerts {
		if got, want := a.Annotations["runbook_url"], base+"#"+strings.ToLower(a.Alert); got != want {
			t.Errorf("%s: runbook_url %q, want %q", a.Alert, got, want)
		}
		body, ok := sections[a.Alert]
		if !ok {
			t.Errorf("docs/runbooks.md has no section ## %s", a.Alert)
			continue
		}
		for _, part := range []string{"**Meaning**", "**Impact**", "**Diagnosis**", "**Mitigation**", "**Escalation**"} {
			if !strings.Contains(body, part) {
				t.Errorf("docs/runbooks.md: the runbook of %s has no %s", a.Alert, part)
			}
		}
	}
	for name := range sections {
		if !slices.Contains(alertNames(alerts), name) {
			t.Errorf("docs/runbooks.md has a section %q, which is not an alert the chart renders", name)
		}
	}
}
