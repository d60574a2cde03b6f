package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// PromtoolBin is the promtool the tests use: $PROMTOOL, or the one make builds into ./bin.
func PromtoolBin() (string, error) {
	return ToolBin("PROMTOOL", "promtool-"+Version("PROMTOOL_VERSION"))
}

// CorrectionRecipe is the example rule file that corrects a user metric of Argo's for the
// stale passes the guard refused.
var CorrectionRecipe = filepath.Join(RepoRoot(), "examples", "corrected-user-metric-rules.yaml")

// WriteRuleFiles writes into dir the rules a promtool test of the corrections loads:
// rules.yaml, the chart's PrometheusRule as helm renders it (release exit-guard in argo), and
// recipe.yaml, the example recipe.
func WriteRuleFiles(helmBin, dir string) error {
	cmd := exec.Command(helmBin, "template", "exit-guard", filepath.Join(RepoRoot(), "charts", "exit-guard"), //nolint:gosec // G204: the repository's pinned helm
		"--namespace", "argo", "--kube-version", KubeVersion(), "--set", "prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("helm template: %w: %s", err, stderr.String())
	}
	var rule struct {
		Spec any `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &rule); err != nil {
		return fmt.Errorf("the chart's PrometheusRule: %w", err)
	}
	if rule.Spec == nil {
		return errors.New("the chart's PrometheusRule has no spec")
	}
	rules, err := yaml.Marshal(rule.Spec)
	if err != nil {
		return err
	}
	recipe, err := os.ReadFile(CorrectionRecipe) //nolint:gosec // G304: a file of this repository
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil { //nolint:gosec // G703: a test-support path chosen by the developer
		return err
	}
	return os.WriteFile(filepath.Join(dir, "recipe.yaml"), recipe, 0o600) //nolint:gosec // G703: the test's own directory
}

// PromtoolTest runs `promtool test rules` on the test file name in dir, beside the rule files
// of WriteRuleFiles.
func PromtoolTest(dir, name string) error {
	helmBin, err := HelmBin()
	if err != nil {
		return err
	}
	promtool, err := PromtoolBin()
	if err != nil {
		return err
	}
	if err := WriteRuleFiles(helmBin, dir); err != nil {
		return err
	}
	cmd := exec.Command(promtool, "test", "rules", name) //nolint:gosec // G204: the repository's pinned promtool
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("promtool test rules %s: %w\n%s", name, err, out)
	}
	return nil
}
