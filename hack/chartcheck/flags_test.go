package chartcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

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

// chartOwnDefaults are the flags whose value in the chart's default render differs from the
// binary's default on purpose, and why.
var chartOwnDefaults = map[string]string{
	"webhook-cert-path":                "where the chart mounts the certificate Secret",
	"cert-mode":                        "the chart's default certificates are the guard's own (certificates.mode: self)",
	"cert-secret":                      "named after the release",
	"cert-dns-name":                    "the release's Service",
	"validating-webhook-configuration": "named after the release",
	"mutating-webhook-configuration":   "named after the release",
	"zap-encoder":                      "a cluster's logs are collected as JSON",
	"zap-log-level":                    "named explicitly, so that logging.level shows what runs",
}

// TestChartDefaultsAreTheBinarys: every flag the chart passes with its default values has the
// binary's default (docs/flags.md, which TestFlagReference keeps the binary's, which takes
// each part's DefaultOptions), or is listed above with the reason it differs. A default
// changed in the code and not in values.yaml, or the other way round, fails here.
func TestChartDefaultsAreTheBinarys(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "flags.md"))
	if err != nil {
		t.Fatal(err)
	}
	guardDoc, _, _ := strings.Cut(string(doc), "\n## exit-guard check")
	defaults := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\| (`[^`]*`|\\(none\\)) \\|").FindAllStringSubmatch(guardDoc, -1) {
		defaults[m[1]] = strings.Trim(m[2], "`")
		if m[2] == "(none)" {
			defaults[m[1]] = ""
		}
	}
	if len(defaults) < 20 {
		t.Fatalf("read only %d defaults from docs/flags.md", len(defaults))
	}
	var compared int
	for _, m := range regexp.MustCompile(`(?m)^\s*- --([a-z0-9-]+)=(.*)$`).FindAllStringSubmatch(string(render(t)), -1) {
		name, value := m[1], strings.Trim(strings.TrimSpace(m[2]), `"`)
		def, known := defaults[name]
		if !known {
			continue // a flag of exit-guard check (the helm test pod), or of another container
		}
		_, why := chartOwnDefaults[name]
		same := sameFlagValue(value, def)
		switch {
		case same && why:
			t.Errorf("--%s: the chart's default %q is the binary's: drop it from chartOwnDefaults", name, value)
		case !same && !why:
			t.Errorf("--%s: the chart's default is %q, the binary's %q (webhook.DefaultOptions and its kin): make values.yaml say the binary's default, or say why in chartOwnDefaults", name, value, def)
		}
		compared++
	}
	if compared < 20 {
		t.Errorf("compared only %d of the chart's arguments with the binary's defaults", compared)
	}
}

// sameFlagValue says whether two values of a flag are the same value: durations by their
// length ("10m" and "10m0s").
func sameFlagValue(a, b string) bool {
	if a == b {
		return true
	}
	da, errA := time.ParseDuration(a)
	db, errB := time.ParseDuration(b)
	return errA == nil && errB == nil && da == db
}
