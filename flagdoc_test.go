package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var updateDocs = flag.Bool("update-docs", false, "write docs/flags.md from the command line (make manifests)")

// flagReference is docs/flags.md: every flag of the guard, of `exit-guard check` and of
// `exit-guard affected`, as the binary defines them.
func flagReference(guard, check, affected *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString(`# Command-line reference

Generated from the binary's own flags by ` + "`make manifests`" + ` (` + "`TestFlagReference`" + `); ` + "`make verify`" + `
fails when this page and the binary disagree. The chart sets the first two groups from its values
([the chart's values](../charts/exit-guard/README.md)); ` + "`extraArgs`" + ` adds any other. ` + "`exit-guard -h`" + `
prints the same, grouped the same way.

`)
	table := func(fs *flag.FlagSet, keep func(string) bool) {
		b.WriteString("| flag | default | meaning |\n| --- | --- | --- |\n")
		fs.VisitAll(func(f *flag.Flag) {
			if !keep(f.Name) {
				return
			}
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
	b.WriteString("## exit-guard\n\n`exit-guard [flags]` runs the guard (the chart's Deployment or sidecar does). Its flags, in three groups:\n\n")
	for _, g := range flagGroups {
		b.WriteString("### " + g.title + "\n\n")
		table(guard, func(name string) bool { return groupOf(name) == g.name })
	}
	b.WriteString("## exit-guard check\n\n`exit-guard check [flags]` proves, with a dry-run exit-handler pod, that the API server calls the guard and that it refuses the pod (`helm test` runs it).\n\n")
	table(check, func(string) bool { return true })
	b.WriteString("## exit-guard affected\n\n`exit-guard affected [flags]` runs before an install, with a kubeconfig alone: it finds Argo's workflow controllers by their labels, says of each whether it sends what the guard refuses, why, and the fix upstream offers, and exits 0 (not affected), 1 (affected), 2 (error) or 3 (cannot tell, or no controller found) ([`docs/install.md`](install.md#before-you-install-do-you-need-it)).\n\n")
	table(affected, func(string) bool { return true })
	return strings.TrimSuffix(b.String(), "\n")
}

// TestFlagReference keeps docs/flags.md what the binary defines: with -update-docs it writes
// the page, otherwise it fails when the page differs.
func TestFlagReference(t *testing.T) {
	// Defaults that come from the environment are documented as they are without it.
	t.Setenv("POD_NAMESPACE", "")
	_, guard := newFlagSet()
	_, check := newCheckFlagSet()
	_, affected := newAffectedFlagSet()
	got := flagReference(guard, check, affected)
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
	if rows, n := strings.Count(string(want), "\n| `--"), countFlags(guard)+countFlags(check)+countFlags(affected); rows != n {
		t.Errorf("%s has %d flag rows, the binary %d flags", path, rows, n)
	}
}

func countFlags(fs *flag.FlagSet) int {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n
}

// TestFlagGroupsAreTheCharts holds the groups of -h and docs/flags.md to the chart: every flag
// the chart renders (in any of the profiles below, the sidecar's values among them) is in the
// tune or chart group, and every flag of those groups is one the chart renders.
func TestFlagGroupsAreTheCharts(t *testing.T) {
	helm, err := testenv.HelmBin()
	if err != nil {
		t.Fatal(err)
	}
	_, guard := newFlagSet()
	_, check := newCheckFlagSet()
	rendered := map[string]bool{}
	for _, set := range [][]string{
		nil,
		{"installMode=sidecar"},
		{"guard.mode=warn"},
		{"metrics.secure=true", "metrics.tokenAudiences={exit-guard}", "pprof.enabled=true", "webhook.clientAuth.caConfigMap=client-ca"},
	} {
		args := []string{"template", "eg", filepath.Join("charts", "exit-guard"), "--namespace", "argo", "--kube-version", testenv.KubeVersion()}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := exec.CommandContext(t.Context(), helm, args...).CombinedOutput() //nolint:gosec // G204: the pinned helm of this repository
		if err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
		for _, m := range regexp.MustCompile(`- --([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
			if guard.Lookup(m[1]) != nil || check.Lookup(m[1]) == nil {
				rendered[m[1]] = true
			}
		}
	}
	for name := range rendered {
		if g := groupOf(name); g == "other" {
			t.Errorf("the chart renders --%s, which flags.go groups as %q: add it to tunedFlags or chartFlags", name, g)
		}
	}
	for _, name := range append(slices.Clone(tunedFlags), chartFlags...) {
		if guard.Lookup(name) == nil {
			t.Errorf("flags.go groups --%s, which is no flag of the guard", name)
		} else if !rendered[name] {
			t.Errorf("flags.go groups --%s as set by the chart, which never renders it", name)
		}
	}
}
