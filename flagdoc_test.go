package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update-docs", false, "write docs/flags.md from the command line (make manifests)")

// flagReference is docs/flags.md: every flag of the guard and of `exit-guard check`, as the
// binary defines them.
func flagReference(guard, check *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString(`# Command-line reference

Generated from the binary's own flags by ` + "`make manifests`" + ` (` + "`TestFlagReference`" + `); ` + "`make verify`" + `
fails when this page and the binary disagree. The chart sets these flags from its values
([the chart's values](../charts/exit-guard/README.md)); ` + "`extraArgs`" + ` adds any other. ` + "`exit-guard -h`" + `
prints the same.

`)
	section := func(title, intro string, fs *flag.FlagSet) {
		b.WriteString("## " + title + "\n\n" + intro + "\n\n| flag | default | meaning |\n| --- | --- | --- |\n")
		fs.VisitAll(func(f *flag.Flag) {
			def := "`" + f.DefValue + "`"
			if f.DefValue == "" {
				def = "(none)"
			}
			usage := strings.Join(strings.Fields(f.Usage), " ")
			usage = strings.ReplaceAll(usage, "|", `\|`)
			fmt.Fprintf(&b, "| `--%s` | %s | %s |\n", f.Name, def, usage)
		})
		b.WriteString("\n")
	}
	section("exit-guard", "`exit-guard [flags]` runs the guard (the chart's Deployment or sidecar does).", guard)
	section("exit-guard check", "`exit-guard check [flags]` proves, with a dry-run exit-handler pod, that the API server calls the guard and that it refuses the pod (`helm test` runs it).", check)
	return strings.TrimSuffix(b.String(), "\n")
}

// TestFlagReference keeps docs/flags.md what the binary defines: with -update-docs it writes
// the page, otherwise it fails when the page differs.
func TestFlagReference(t *testing.T) {
	// Defaults that come from the environment are documented as they are without it.
	t.Setenv("POD_NAMESPACE", "")
	_, guard := newFlagSet()
	_, check := newCheckFlagSet()
	got := flagReference(guard, check)
	path := filepath.Join("docs", "flags.md")
	if *updateDocs {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil { //nolint:gosec // G306: a document of the repository
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run make manifests", err)
	}
	if string(want) != got {
		t.Errorf("%s is not what the binary's flags say: run make manifests (go test -run '^TestFlagReference$' . -update-docs)", path)
	}
	if rows, n := strings.Count(string(want), "\n| `--"), countFlags(guard)+countFlags(check); rows != n {
		t.Errorf("%s has %d flag rows, the binary %d flags", path, rows, n)
	}
}

func countFlags(fs *flag.FlagSet) int {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n
}
