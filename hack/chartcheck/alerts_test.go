package chartcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/exit-guard/exit-guard/internal/testenv"
)

// renderedAlerts are the names of the alerts the chart's PrometheusRule renders.
func renderedAlerts(t *testing.T) []string {
	t.Helper()
	bin, err := testenv.HelmBin()
	if err != nil {
		t.Fatalf("these checks need helm: %v", err)
	}
	out, err := exec.Command(bin, "template", "doc", chartDir, "--namespace", "argo", "--kube-version", testenv.KubeVersion(), //nolint:gosec // G204: the pinned helm of this repository
		"--set", "prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllStringSubmatch(string(out), -1) {
		names = append(names, m[1])
	}
	if len(names) == 0 {
		t.Fatal("the chart's PrometheusRule rendered no alert")
	}
	return names
}

// TestAlertsTableIsTheChartsAlerts: docs/alerts.md's runbook table has one row per alert the
// chart renders, no other, and each row says when it fires and what to do in words (a row of
// the e2e timings pasted over it, "12.8 s", says neither).
func TestAlertsTableIsTheChartsAlerts(t *testing.T) {
	alerts := renderedAlerts(t)
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
	for _, line := range strings.Split(doc[start:], "\n")[2:] {
		if !strings.HasPrefix(line, "| `") {
			break
		}
		cells := strings.Split(line, " | ")
		name := strings.Trim(cells[0], "| `")
		rows = append(rows, name)
		if len(cells) != 4 {
			t.Errorf("docs/alerts.md: the row of %s has %d cells, want 4", name, len(cells))
			continue
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

// TestNoDocCountsTheAlerts: a count of the alerts typed into a document goes stale with the next
// alert (three places said "seven" when there were fourteen); documents name docs/alerts.md
// instead.
func TestNoDocCountsTheAlerts(t *testing.T) {
	count := regexp.MustCompile(`(?i)\b(\d+|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|twenty)\s+alerts\b`)
	root := testenv.RepoRoot()
	for _, rel := range []string{"README.md", "charts/exit-guard/Chart.yaml", "charts/exit-guard/CHANGELOG.md", "charts/exit-guard/README.md",
		"charts/exit-guard/README.md.gotmpl", "charts/exit-guard/templates/NOTES.txt", "docs/alerts.md"} {
		raw, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range count.FindAllString(string(raw), -1) {
			t.Errorf("%s counts the alerts (%q): name docs/alerts.md instead, whose table a test checks", rel, m)
		}
	}
}
