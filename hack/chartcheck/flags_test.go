package chartcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// notChartValues are the guard's flags the chart sets from no value of its own, and why.
var notChartValues = map[string]string{
	"version":              "prints the version and exits",
	"cert-namespace":       "defaults to the pod's namespace, the release's",
	"cert-extra-dns-names": "the chart's Service has one DNS name; extraArgs adds more",
	"enable-http2":         "off on purpose (main.go); extraArgs turns it on",
	"webhook-cert-name":    "the chart mounts the certificate under the default names",
	"webhook-cert-key":     "the chart mounts the certificate under the default names",
	"zap-devel":            "logging.level and logging.format cover what a cluster needs",
	"zap-stacktrace-level": "logging.level and logging.format cover what a cluster needs",
	"zap-time-encoding":    "the chart's logs use ISO 8601, the binary's default",
}

// TestEveryFlagIsAChartValue: every flag of the guard (docs/flags.md, which TestFlagReference
// keeps the binary's) is passed by the chart's arguments, from a value, or is listed above
// with the reason it is not. A new tuning flag without a value fails here.
func TestEveryFlagIsAChartValue(t *testing.T) {
	root := testenv.RepoRoot()
	doc, err := os.ReadFile(filepath.Join(root, "docs", "flags.md"))
	if err != nil {
		t.Fatal(err)
	}
	guard, _, ok := strings.Cut(string(doc), "\n## exit-guard check")
	if !ok {
		t.Fatal("docs/flags.md has no section for exit-guard check")
	}
	flags := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`").FindAllStringSubmatch(guard, -1)
	if len(flags) < 20 {
		t.Fatalf("found only %d flags in docs/flags.md", len(flags))
	}
	helpers, err := os.ReadFile(filepath.Join(chartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	var passed []string
	for _, m := range regexp.MustCompile(`(?m)^\s*- --([a-z0-9-]+)`).FindAllStringSubmatch(string(helpers), -1) {
		passed = append(passed, m[1])
	}
	for _, f := range flags {
		name := f[1]
		_, why := notChartValues[name]
		switch {
		case slices.Contains(passed, name) && why:
			t.Errorf("--%s is passed by the chart and listed as not a chart value: drop it from notChartValues", name)
		case !slices.Contains(passed, name) && !why:
			t.Errorf("--%s is set by no chart value: add a value (values.yaml, the schema, exit-guard.args) or say why in notChartValues", name)
		}
	}
}
