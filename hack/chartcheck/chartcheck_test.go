// Package chartcheck keeps the chart's values, their schema and the documentation that sets
// them from drifting apart. It needs helm, not an API server: `make verify` runs it.
package chartcheck

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var chartDir = filepath.Join(testenv.RepoRoot(), "charts", "exit-guard")

// render runs helm template with the extra arguments (Helm checks the values against
// values.schema.json), fails the test when it refuses, and returns what it rendered.
func render(t *testing.T, extra ...string) []byte {
	t.Helper()
	return renderChart(t, chartDir, append([]string{"--kube-version", testenv.KubeVersion()}, extra...)...)
}

// renderChart is render of the chart in dir.
func renderChart(t *testing.T, dir string, extra ...string) []byte {
	t.Helper()
	bin, err := testenv.HelmBin()
	if err != nil {
		t.Fatalf("these checks need helm: %v", err)
	}
	args := append([]string{"template", "doc", dir, "--namespace", "argo"}, extra...)
	cmd := exec.Command(bin, args...) //nolint:gosec // G204: the pinned helm of this repository
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// schemaNode is the part of a JSON schema the test reads.
type schemaNode struct {
	Type                 any                    `json:"type"`
	Enum                 []any                  `json:"enum"`
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties any                    `json:"additionalProperties"`
}

// TestSchemaAndValuesNameTheSameKeys walks values.yaml and values.schema.json together: every
// value has a typed entry in the schema, and every entry of the schema is a value (a key
// renamed or removed on one side only fails here, not in a user's install). Helm itself checks
// every render, of every profile of test/chart too, against the schema.
func TestSchemaAndValuesNameTheSameKeys(t *testing.T) {
	var values map[string]any
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	var schema schemaNode
	raw, err = os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	var walk func(path string, v map[string]any, s *schemaNode)
	walk = func(path string, v map[string]any, s *schemaNode) {
		for _, k := range sortedKeys(v) {
			p := strings.TrimPrefix(path+"."+k, ".")
			sub, ok := s.Properties[k]
			if !ok {
				t.Errorf("value %s has no entry in values.schema.json", p)
				continue
			}
			if sub.Type == nil && sub.Enum == nil {
				t.Errorf("the schema does not type %s", p)
			}
			if m, ok := v[k].(map[string]any); ok && sub.Properties != nil {
				walk(p, m, sub)
			}
		}
		for k := range s.Properties {
			if _, ok := v[k]; !ok {
				t.Errorf("values.schema.json has %s, which values.yaml does not", strings.TrimPrefix(path+"."+k, "."))
			}
		}
	}
	walk("", values, &schema)
}

func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

// TestEveryValueTheDocsNameExists reads the runbooks and every other page a user acts from
// (docs/*.md, the README, the chart's README and NOTES): every value they name in backticks
// (`prometheusRule.notReadyFor`, `webhook.timeoutSeconds=3`) is a key of values.schema.json,
// so that no runbook sends anyone to a key the schema refuses.
func TestEveryValueTheDocsNameExists(t *testing.T) {
	var schema schemaNode
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	root := testenv.RepoRoot()
	files := []string{filepath.Join(root, "README.md"), filepath.Join(chartDir, "templates", "NOTES.txt"), filepath.Join(chartDir, "README.md")}
	m, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, m...)
	key := regexp.MustCompile("`([a-z][A-Za-z0-9]*(?:\\.[A-Za-z0-9<>_-]+)+)(?:=[^`]*)?`")
	named := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range key.FindAllStringSubmatch(string(raw), -1) {
			path := strings.Split(m[1], ".")
			if schema.Properties[path[0]] == nil || len(path) < 2 || slices.Contains([]string{"go", "md", "yaml", "json"}, path[len(path)-1]) {
				continue // not a value of this chart (a label, a file, a metric)
			}
			named++
			if where := missing(&schema, path); where != "" {
				t.Errorf("%s names `%s`, which values.schema.json does not have (%s)", filepath.Base(f), m[1], where)
			}
		}
	}
	if named < 50 {
		t.Errorf("the pages name %d values; the test reads too few to mean anything", named)
	}
}

// missing says where path leaves the schema ("" when it is a key of it): an object the schema
// does not close (no properties, or additionalProperties other than false) takes any key below.
func missing(s *schemaNode, path []string) string {
	for i, k := range path {
		if s.Properties[k] != nil {
			s = s.Properties[k]
			continue
		}
		if s.Properties == nil || s.AdditionalProperties != nil && s.AdditionalProperties != false {
			return ""
		}
		return "no " + strings.Join(path[:i+1], ".")
	}
	return ""
}

// TestDocumentedValuesPassTheSchema renders the chart with every value the documentation tells
// a user to set (`--set` in the README, docs/ and the chart's own files, and the valuesObject
// of the Argo CD recipe): Helm checks each against values.schema.json, and a documented value
// the schema refuses, or a key that does not exist, fails here.
func TestDocumentedValuesPassTheSchema(t *testing.T) {
	root := testenv.RepoRoot()
	files := []string{filepath.Join(root, "README.md"), filepath.Join(chartDir, "templates", "NOTES.txt")}
	for _, pattern := range []string{filepath.Join(root, "docs", "*.md"), filepath.Join(root, "docs", "evidence", "*.md"), filepath.Join(chartDir, "*.md")} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	set := regexp.MustCompile("--set[ =]([^ `\\n]+)")
	var sets []string
	for _, f := range files {
		raw, err := os.ReadFile(f) //nolint:gosec // G304: the repository's own documentation
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range set.FindAllStringSubmatch(string(raw), -1) {
			sets = append(sets, m[1])
		}
	}
	if len(sets) < 3 {
		t.Fatalf("found only %v in the documentation", sets)
	}
	for _, s := range sets {
		render(t, "--set", s)
	}

	raw, err := os.ReadFile(filepath.Join(root, "examples", "argocd-application.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var app struct {
		Spec struct {
			Source struct {
				Helm struct {
					ValuesObject map[string]any `json:"valuesObject"`
				} `json:"helm"`
			} `json:"source"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &app); err != nil {
		t.Fatal(err)
	}
	if len(app.Spec.Source.Helm.ValuesObject) == 0 {
		t.Fatal("the Argo CD recipe sets no values")
	}
	vals, err := yaml.Marshal(app.Spec.Source.Helm.ValuesObject)
	if err != nil {
		t.Fatal(err)
	}
	vf := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(vf, vals, 0o600); err != nil {
		t.Fatal(err)
	}
	render(t, "-f", vf)
}

// TestRendersAsASubchart: an umbrella chart passes its global values down to every subchart;
// the schema, which refuses unknown keys, must take them (seen failing without "global").
func TestRendersAsASubchart(t *testing.T) {
	render(t, "--set", "global.imageRegistry=registry.example", "--set", "global.labels.team=platform")
}

// TestKubernetes129IsRefused: the README refuses Kubernetes 1.29 and older, and says why; the
// chart does so before anything is created (its kubeVersion), and renders on 1.30.
func TestKubernetes129IsRefused(t *testing.T) {
	bin, err := testenv.HelmBin()
	if err != nil {
		t.Fatal(err)
	}
	for version, ok := range map[string]bool{"1.29.15": false, "1.28.15": false, "1.30.0": true} {
		out, err := exec.Command(bin, "template", "doc", chartDir, "--namespace", "argo", "--kube-version", version).CombinedOutput() //nolint:gosec // G204: the pinned helm of this repository
		switch {
		case ok && err != nil:
			t.Errorf("Kubernetes %s: the chart does not render: %v\n%s", version, err, out)
		case !ok && (err == nil || !strings.Contains(string(out), "chart requires kubeVersion: >=1.30.0-0")):
			t.Errorf("Kubernetes %s: the chart renders, or refuses without saying why: %v\n%s", version, err, bytes.TrimSpace(out)[:min(200, len(bytes.TrimSpace(out)))])
		}
	}
	readme, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "Kubernetes 1.29 and older are refused") {
		t.Error("the README does not say that Kubernetes 1.29 and older are refused, and why")
	}
}
