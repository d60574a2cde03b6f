package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestLayoutIsTrue: every path the README's "Where things are" names, and every file of the
// webhook package that webhook/doc.go names, exists; and the table names every package of
// the module, and doc.go every file of the package but a kind's own, so that a package or a
// file moved or added cannot leave them behind.
func TestLayoutIsTrue(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "\n## Where things are\n")
	if !ok {
		t.Fatal(`README.md has no "Where things are" section`)
	}
	table, _, _ = strings.Cut(table, "\n## ")
	code := regexp.MustCompile("`([^`]+)`")
	var named []string
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			named = append(named, m[1])
		}
	}
	if len(named) < 10 {
		t.Fatalf("read %d paths from the README's table, want its rows: %q", len(named), named)
	}
	for _, p := range named {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the README's table names %s: %v", p, err)
		}
	}
	// Every top-level folder with Go packages is named, as are internal/'s shipped packages.
	top := map[string]bool{}
	for _, p := range named {
		top[strings.SplitN(strings.TrimSuffix(p, "/"), "/", 2)[0]] = true
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && e.Name() != "bin" && !top[e.Name()] {
			t.Errorf("the README's table does not name %s/", e.Name())
		}
	}
	internal, err := os.ReadDir("internal")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range internal {
		if e.IsDir() && !strings.Contains(table, "`"+e.Name()+"`") {
			t.Errorf("the README's table does not name internal/%s", e.Name())
		}
	}

	doc, err := os.ReadFile(filepath.Join("webhook", "doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	files := regexp.MustCompile(`\b[a-z0-9_]+\.go\b`).FindAllString(string(doc), -1)
	if len(files) < 5 {
		t.Fatalf("read %d file names from webhook/doc.go: %q", len(files), files)
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join("webhook", f)); err != nil {
			t.Errorf("webhook/doc.go names %s: %v", f, err)
		}
	}
	// And the other way: every file of the package but doc.go, the tests and a kind's own files
	// is named. A kind's files are the one that declares its kindSpec and its <kind>_rows.go: a
	// kind added later needs no line in doc.go (docs/development.md).
	sources, err := filepath.Glob(filepath.Join("webhook", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	kindFile := func(name string) bool {
		decl := name
		if base, ok := strings.CutSuffix(name, "_rows.go"); ok {
			decl = base + ".go"
		}
		raw, err := os.ReadFile(filepath.Join("webhook", decl))
		return err == nil && bytes.Contains(raw, []byte("= &kindSpec{"))
	}
	for _, f := range sources {
		name := filepath.Base(f)
		if name != "doc.go" && !strings.HasSuffix(name, "_test.go") && !slices.Contains(files, name) && !kindFile(name) {
			t.Errorf("webhook/doc.go does not name %s, which is not a kind's own file (<kind>.go declaring its kindSpec, or <kind>_rows.go)", name)
		}
	}
}
