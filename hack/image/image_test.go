//go:build envtest

package main

import (
	"archive/tar"
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	vwc, err := testenv.GuardWebhook()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	os.Exit(testenv.Main(m, testenv.Options{
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{vwc},
	}, &env))
}

// dockerfileSources returns the sources of the COPY instructions of the Dockerfile's build
// stage (not the ones that copy from another stage).
func dockerfileSources(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(testenv.RepoRoot(), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var srcs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || !strings.EqualFold(fields[0], "COPY") || strings.HasPrefix(fields[1], "--from") {
			continue
		}
		srcs = append(srcs, fields[1:len(fields)-1]...)
	}
	if len(srcs) == 0 {
		t.Fatal("the Dockerfile copies nothing")
	}
	return srcs
}

// copied says whether a COPY source brings file (relative to the repository): the file
// itself, a folder above it, or a pattern of its folder.
func copied(srcs []string, file string) bool {
	for _, s := range srcs {
		if s == file || (strings.HasSuffix(s, "/") && strings.HasPrefix(file, s)) {
			return true
		}
		if ok, _ := filepath.Match(s, file); ok {
			return true
		}
	}
	return false
}

// TestDockerfileCopiesEveryFileTheBinaryIsBuiltFrom lists, with `go list -deps`, every file of
// this module that the linux binary is compiled or embeds from, and fails for each that no COPY
// of the Dockerfile brings: a new package or file would otherwise break `docker build` alone.
func TestDockerfileCopiesEveryFileTheBinaryIsBuiltFrom(t *testing.T) {
	root := testenv.RepoRoot()
	cmd := exec.Command("go", "list", "-deps", "-f",
		`{{if and .Module .Module.Main}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}`, ".")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	srcs := dockerfileSources(t)
	files := []string{"go.mod", "go.sum"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		dir, err := filepath.Rel(root, fields[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields[1:] {
			files = append(files, filepath.ToSlash(filepath.Join(dir, f)))
		}
	}
	if len(files) < 10 {
		t.Fatalf("go list found only %v", files)
	}
	for _, f := range files {
		if !copied(srcs, f) {
			t.Errorf("the Dockerfile does not copy %s, which the binary is built from", f)
		}
	}
}

// TestImageHoldsAStaticGuardThatStarts builds the image as `make image` does, for this machine's
// architecture, writes and reads back its OCI layout, and checks what it holds: one layer with
// /exit-guard alone, static, executable; run as user 65532; and its entrypoint, run with the
// guard's flags against a real API server, serves the webhook, whose refusal of a stale pod
// the image's own `check` command then proves.
func TestImageHoldsAStaticGuardThatStarts(t *testing.T) {
	dir := t.TempDir()
	bin, err := buildBinary(testenv.RepoRoot(), runtime.GOARCH, filepath.Join(dir, "build"), "")
	if err != nil {
		t.Fatal(err)
	}
	idx, err := buildIndex([]arch{bin}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := writeLayout(filepath.Join(dir, "layout"), "exit-guard/exit-guard:test", idx); err != nil {
		t.Fatal(err)
	}
	back, err := readLayout(filepath.Join(dir, "layout"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := buildIndex([]arch{bin}, "test")
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := back.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("two builds of the same binary differ: %s and %s", d1, d2)
	}

	m, err := back.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Platform == nil || m.Manifests[0].Platform.OS != "linux" || m.Manifests[0].Platform.Architecture != runtime.GOARCH {
		t.Fatalf("the index lists %+v, want one linux/%s image", m.Manifests, runtime.GOARCH)
	}
	img, err := back.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want OCI", mt)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || !slices.Equal(cf.Config.Entrypoint, []string{"/exit-guard"}) || cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("config user %q entrypoint %v platform %s/%s, want 65532:65532, [/exit-guard], linux/%s",
			cf.Config.User, cf.Config.Entrypoint, cf.OS, cf.Architecture, runtime.GOARCH)
	}

	rootfs := filepath.Join(dir, "rootfs")
	entries := unpack(t, img, rootfs)
	if !slices.Equal(entries, []string{"exit-guard 0755"}) {
		t.Errorf("the image holds %v, want the binary alone, mode 0755", entries)
	}
	entrypoint := filepath.Join(rootfs, cf.Config.Entrypoint[0])
	checkStatic(t, entrypoint)

	// The entrypoint starts the guard: ready, and the API server's calls refuse a pod of a
	// workflow that does not exist, as the image's own `check` command shows.
	out := &testenv.Output{}
	g, err := testenv.StartGuard(t.Context(), entrypoint, env.KubeConfig(), append(cf.Config.Cmd,
		"--webhook-port="+strconv.Itoa(env.WebhookPort), "--webhook-cert-path="+env.WebhookCertDir, "--shutdown-delay=0s"), out)
	if err != nil {
		t.Fatalf("the image's entrypoint did not start the guard: %v\n%s", err, out)
	}
	defer func() { _ = g.Stop() }()
	check := exec.CommandContext(t.Context(), entrypoint, "check", "--namespace=default") //nolint:gosec // G204: the binary the image holds
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	check.Env = append(os.Environ(), "KUBECONFIG="+kc)
	if msg, err := check.CombinedOutput(); err != nil || !strings.Contains(string(msg), "exit-guard check: OK") {
		t.Errorf("exit-guard check against the image's guard: %v\n%s\nguard:\n%s", err, msg, out)
	}
}

// unpack extracts the image's layers into dir and lists their entries with their modes.
func unpack(t *testing.T, img v1.Image, dir string) []string {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var entries []string
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			entries = append(entries, fmt.Sprintf("%s %04o", h.Name, h.Mode))
			if h.Typeflag != tar.TypeReg || strings.Contains(h.Name, "..") {
				continue
			}
			p := filepath.Join(dir, filepath.Clean(h.Name))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode)) //nolint:gosec // G115, G304: a test's own image
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil { //nolint:gosec // G110: a test's own image
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
		_ = rc.Close()
	}
	return entries
}

// checkStatic fails unless path is an ELF executable with no interpreter and no shared
// libraries: it runs on an image with nothing else in it.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("the entrypoint is not an ELF binary: %v", err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the binary needs a dynamic loader: it would not run on an empty image")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
}
