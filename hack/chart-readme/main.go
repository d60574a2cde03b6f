// Command chart-readme writes a chart's README.md from the comments of its values.yaml: every
// key preceded by a "# -- text" comment becomes a row of the values table, with its default.
// make verify runs it and fails when the committed README differs.
//
// Usage: go run ./hack/chart-readme CHART_DIR
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

var keyLine = regexp.MustCompile(`^(\s*)([A-Za-z0-9_.-]+):`)

type row struct{ key, def, doc string }

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: chart-readme CHART_DIR")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "chart-readme:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		return err
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		return fmt.Errorf("parsing values.yaml: %w", err)
	}
	chartRaw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return err
	}
	var chart struct {
		Name, Description, Version, AppVersion string
	}
	if err := yaml.Unmarshal(chartRaw, &chart); err != nil {
		return fmt.Errorf("parsing Chart.yaml: %w", err)
	}

	var rows []row
	var path []string
	var indents []int
	var doc []string
	for i, line := range strings.Split(string(raw), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "# --"):
			doc = []string{strings.TrimSpace(strings.TrimPrefix(trimmed, "# --"))}
			continue
		case strings.HasPrefix(trimmed, "#") && doc != nil:
			doc = append(doc, strings.TrimSpace(strings.TrimPrefix(trimmed, "#")))
			continue
		}
		m := keyLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		indent := len(m[1])
		for len(indents) > 0 && indents[len(indents)-1] >= indent {
			indents, path = indents[:len(indents)-1], path[:len(path)-1]
		}
		indents, path = append(indents, indent), append(path, m[2])
		if doc == nil {
			continue
		}
		def, ok := lookup(values, path)
		if !ok {
			return fmt.Errorf("values.yaml line %d: no value at %s", i+1, strings.Join(path, "."))
		}
		rows = append(rows, row{key: strings.Join(path, "."), def: def, doc: strings.Join(doc, " ")})
		doc = nil
	}

	documented := map[string]bool{}
	for _, r := range rows {
		documented[r.key] = true
	}
	if missing := undocumented(values, "", documented); len(missing) > 0 {
		return fmt.Errorf("values.yaml: no \"# --\" comment for %s", strings.Join(missing, ", "))
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s\n\n%s\n\nChart version %s, app version %s.\n\n", chart.Name, chart.Description, chart.Version, chart.AppVersion)
	b.WriteString("This file is generated from the comments of values.yaml by `make manifests`; edit those.\n\n")
	b.WriteString("## Values\n\n| key | default | description |\n| --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", r.key, strings.ReplaceAll(r.def, "|", `\|`), strings.ReplaceAll(r.doc, "|", `\|`))
	}
	return os.WriteFile(filepath.Join(dir, "README.md"), b.Bytes(), 0o600)
}

func lookup(values map[string]any, path []string) (string, bool) {
	var cur any = values
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false
		}
		if cur, ok = m[p]; !ok {
			return "", false
		}
	}
	out, err := json.Marshal(cur)
	if err != nil {
		return "", false
	}
	return string(out), true
}

// undocumented lists the values under prefix that neither carry a comment nor sit under a
// commented key.
func undocumented(v map[string]any, prefix string, documented map[string]bool) []string {
	var out []string
	for k, child := range v {
		key := strings.TrimPrefix(prefix+"."+k, ".")
		if documented[key] {
			continue
		}
		if m, ok := child.(map[string]any); ok && len(m) > 0 {
			out = append(out, undocumented(m, key, documented)...)
			continue
		}
		out = append(out, key)
	}
	return out
}
