//go:build envtest

package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// promtool returns the promtool binary: $PROMTOOL, or the one make builds into ./bin.
func promtool(t *testing.T) string {
	t.Helper()
	bin, err := testenv.ToolBin("PROMTOOL", "promtool-"+testenv.Version("PROMTOOL_VERSION"))
	if err != nil {
		t.Fatalf("the alert tests need promtool: %v", err)
	}
	return bin
}

// TestAlertRules renders the chart's PrometheusRule (release "exit-guard" in "argo"), checks
// the rules with `promtool check rules`, and runs the unit tests of testdata/alerts_test.yaml
// on them with `promtool test rules`: each alert firing on synthetic series that should fire
// it, and silent on series that should not.
func TestAlertRules(t *testing.T) {
	objs := render(t, profile{name: "alerts", set: []string{"prometheusRule.enabled=true"}}, "exit-guard", "argo")
	rule := only(t, objs, "PrometheusRule")
	spec, ok := rule.Object["spec"]
	if !ok {
		t.Fatal("the PrometheusRule has no spec")
	}
	rules, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	// With prometheusRule.clusterLabel, one ruler over two clusters: each cluster's alert its own.
	clustered := only(t, render(t, profile{name: "alerts-cluster", set: []string{"prometheusRule.enabled=true", "prometheusRule.clusterLabel=cluster"}}, "exit-guard", "argo"), "PrometheusRule")
	clusterDir := t.TempDir()
	clusterRules, err := yaml.Marshal(clustered.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	clusterTests, err := os.ReadFile(filepath.Join("testdata", "alerts_cluster_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(clusterDir, "rules.yaml"), clusterRules, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(clusterDir, "alerts_test.yaml"), clusterTests, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool(t), "test", "rules", "alerts_test.yaml") //nolint:gosec // G204: the pinned promtool of this repository
	cmd.Dir = clusterDir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules, prometheusRule.clusterLabel=cluster: %v\n%s", err, out)
	}
	// Every alert of the chart has a test that shows it firing.
	for _, name := range alertNames(t, spec) {
		if !strings.Contains(string(tests), "alertname: "+name+"\n        exp_alerts:\n          - ") {
			t.Errorf("alert %s has no test where it fires", name)
		}
	}
	// Over several namespaces the watch reports no bookmarks: a quiet namespace must not look
	// stalled.
	scoped := only(t, render(t, profile{name: "scoped", set: []string{"prometheusRule.enabled=true", "guard.namespaces={argo,ci}"}}, "exit-guard", "argo"), "PrometheusRule")
	if slices.Contains(alertNames(t, scoped.Object["spec"]), "ExitGuardWatchStalled") {
		t.Errorf("ExitGuardWatchStalled is rendered with guard.namespaces, where only events move the watch's progress")
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool(t), args...) //nolint:gosec // G204: the pinned promtool of this repository
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// alertNames lists the alerts of a PrometheusRule's spec.
func alertNames(t *testing.T, spec any) []string {
	t.Helper()
	var s struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	raw, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range s.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				names = append(names, r.Alert)
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("the PrometheusRule has no alerts")
	}
	return names
}

// TestCorrectionOnCapturedSeries runs the promtool tests that the proof on real controllers
// wrote from the series of its runs (make e2e-argo E2E_RUN=^TestSignalsNoWebhookCanStop
// E2E_CAPTURE_DIR=...), on the chart's correction rules and the recipe of
// examples/corrected-user-metric-rules.yaml as they are now: the corrected alert fires for
// the failing workflow alone, the control without the guard's series for the succeeding ones
// too.
func TestCorrectionOnCapturedSeries(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "captured", "signals-*_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("captured series of v3.4.17 and v3.6.18 expected in testdata/captured, found %v", files)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), raw, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := testenv.PromtoolTest(dir, filepath.Base(f)); err != nil {
				t.Error(err)
			}
		})
	}
}
