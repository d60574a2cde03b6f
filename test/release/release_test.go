//go:build release

// Package release runs the release workflow's script (hack/release.sh snapshot) against a
// registry in this process, on loopback, and checks what a user of the release gets: a
// multi-arch image whose binary names the release's version, an SBOM of each platform attested
// to it, a chart of the same version whose default values install that image on a real API
// server, and signatures that verify with the run's key and not with another. make
// test-release builds the tools (helm, cosign, syft) from Go modules and runs it.
package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, testenv.Options{}, &env)) }

// tool is a release tool: $env, or the one make builds into ./bin.
func tool(t *testing.T, envName, file string) string {
	t.Helper()
	bin, err := testenv.ToolBin(envName, file)
	if err != nil {
		t.Fatalf("the release test needs %s (make test-release builds it): %v", file, err)
	}
	return bin
}

// run runs a command and returns its standard output, failing the test with its output when
// it fails.
func run(t *testing.T, environ []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...) //nolint:gosec // G204: this repository's tools and script
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), environ...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s\n%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// chartMeta is what the test reads of a Chart.yaml.
type chartMeta struct {
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

func TestReleaseSnapshot(t *testing.T) {
	helm := tool(t, "HELM", "helm-"+testenv.Version("HELM_VERSION"))
	cosign := tool(t, "COSIGN", "cosign-"+testenv.Version("COSIGN_VERSION"))
	syft := tool(t, "SYFT", "syft-"+testenv.Version("SYFT_VERSION"))

	var want chartMeta
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "charts", "exit-guard", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}

	reg := httptest.NewServer(registry.New())
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	dist := filepath.Join(t.TempDir(), "release")
	run(t, []string{"HELM=" + helm, "COSIGN=" + cosign, "SYFT=" + syft, "DIST=" + dist, "SNAPSHOT_REGISTRY=" + host},
		"hack/release.sh", "snapshot")

	rel := map[string]string{}
	envFile, err := os.ReadFile(filepath.Join(dist, "release.env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(envFile)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		rel[k] = v
	}
	version := rel["VERSION"]
	if version != want.AppVersion || version != want.Version {
		t.Fatalf("released version %q; Chart.yaml has version %q, appVersion %q: want one version", version, want.Version, want.AppVersion)
	}
	image := host + "/exit-guard/exit-guard"
	if rel["IMAGE"] != image+":"+version {
		t.Errorf("released image %q, want %s:%s", rel["IMAGE"], image, version)
	}

	t.Run("the image is multi-arch, and its binary names the release", func(t *testing.T) {
		ref, err := name.ParseReference(rel["IMAGE"])
		if err != nil {
			t.Fatal(err)
		}
		idx, err := remote.Index(ref)
		if err != nil {
			t.Fatalf("pulling the image index: %v", err)
		}
		if d, _ := idx.Digest(); d.String() != rel["IMAGE_DIGEST"] {
			t.Errorf("the registry's index is %s, the release says %s", d, rel["IMAGE_DIGEST"])
		}
		m, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		var platforms []string
		for _, d := range m.Manifests {
			if d.Platform != nil {
				platforms = append(platforms, d.Platform.OS+"/"+d.Platform.Architecture)
			}
		}
		slices.Sort(platforms)
		if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
			t.Errorf("platforms %v, want linux/amd64 and linux/arm64", platforms)
		}
		if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
			t.Fatalf("this machine (%s) runs neither of the image's binaries", runtime.GOARCH)
		}
		img, err := remote.Image(ref, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(t.TempDir(), "exit-guard")
		if err := os.WriteFile(bin, fileOf(t, img, "exit-guard"), 0o700); err != nil { //nolint:gosec // G306: an executable
			t.Fatal(err)
		}
		out := run(t, nil, bin, "--version")
		if !strings.Contains(out, version) || !strings.Contains(out, rel["COMMIT"]) {
			t.Errorf("the image's exit-guard --version says %q, want version %s and commit %s", out, version, rel["COMMIT"])
		}
	})

	t.Run("each platform has an SBOM that lists the modules the binary is built from", func(t *testing.T) {
		for _, arch := range []string{"amd64", "arm64"} {
			raw, err := os.ReadFile(filepath.Join(dist, fmt.Sprintf("exit-guard_%s_linux_%s.sbom.spdx.json", version, arch)))
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				SPDXVersion string `json:"spdxVersion"`
				Packages    []struct {
					Name    string `json:"name"`
					Version string `json:"versionInfo"`
				} `json:"packages"`
			}
			if err := json.Unmarshal(raw, &doc); err != nil {
				t.Fatalf("%s SBOM: %v", arch, err)
			}
			found := map[string]string{}
			for _, p := range doc.Packages {
				found[p.Name] = p.Version
			}
			for mod, v := range goModRequires(t, "sigs.k8s.io/controller-runtime", "k8s.io/api", "go.uber.org/zap") {
				if found[mod] != v {
					t.Errorf("%s SBOM (%s): %s at %q, want %s as go.mod requires", arch, doc.SPDXVersion, mod, found[mod], v)
				}
			}
		}
	})

	t.Run("signatures and attestations verify with the run's key, not with another", func(t *testing.T) {
		pub := filepath.Join(dist, "cosign.pub")
		verify := []string{"--key", pub, "--insecure-ignore-tlog", "--allow-http-registry"}
		run(t, nil, cosign, append([]string{"verify"}, append(verify, rel["IMAGE"])...)...)
		run(t, nil, cosign, append([]string{"verify"}, append(verify, host+"/exit-guard/charts/exit-guard:"+version)...)...)
		// The digests the release signed and attested, as it wrote them.
		digests, err := os.ReadFile(filepath.Join(dist, "image.digests"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(digests)), "\n") {
			platform, digest, _ := strings.Cut(line, " ")
			if platform == "index" {
				continue
			}
			run(t, nil, cosign, append([]string{"verify-attestation", "--type", "spdxjson"}, append(verify, image+"@"+digest)...)...)
		}
		run(t, nil, cosign, "verify-blob", "--key", pub, "--insecure-ignore-tlog", "--bundle", filepath.Join(dist, "SHA256SUMS.cosign.bundle"), filepath.Join(dist, "SHA256SUMS"))

		other := filepath.Join(t.TempDir(), "other")
		run(t, []string{"COSIGN_PASSWORD="}, cosign, "generate-key-pair", "--output-key-prefix", other)
		cmd := exec.CommandContext(t.Context(), cosign, "verify", "--key", other+".pub", "--insecure-ignore-tlog", "--allow-http-registry", rel["IMAGE"]) //nolint:gosec // G204: the pinned cosign
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("the image verified with a key that did not sign it:\n%s", out)
		}
	})

	t.Run("the chart is the release's, and its defaults install the released image", func(t *testing.T) {
		pulled := t.TempDir()
		run(t, nil, helm, "pull", "oci://"+host+"/exit-guard/charts/exit-guard", "--version", version, "--plain-http", "--destination", pulled)
		archive := filepath.Join(pulled, "exit-guard-"+version+".tgz")
		var got chartMeta
		if err := yaml.Unmarshal(fileInTgz(t, archive, "exit-guard/Chart.yaml"), &got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("the pushed chart is %+v, want %+v", got, want)
		}
		kc := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
			t.Fatal(err)
		}
		ns := "release-" + strings.ReplaceAll(version, ".", "-")
		run(t, nil, helm, "install", "exit-guard", archive, "--namespace", ns, "--create-namespace", "--kubeconfig", kc)
		t.Cleanup(func() {
			_ = exec.Command(helm, "uninstall", "exit-guard", "--namespace", ns, "--kubeconfig", kc).Run() //nolint:gosec // G204: the pinned helm
		})
		var d appsv1.Deployment
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "exit-guard"}, &d); err != nil {
			t.Fatalf("the installed Deployment: %v", err)
		}
		if img := d.Spec.Template.Spec.Containers[0].Image; img != "ghcr.io/exit-guard/exit-guard:"+version {
			t.Errorf("the chart's default values install %s, want the released ghcr.io/exit-guard/exit-guard:%s", img, version)
		}
	})
}

// goModRequires returns the versions go.mod requires of mods.
func goModRequires(t *testing.T, mods ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range mods {
		v := strings.TrimSpace(run(t, nil, "go", "list", "-m", "-f", "{{.Version}}", m))
		out[m] = v
	}
	return out
}

// fileOf returns the file at path in the image's layers.
func fileOf(t *testing.T, img v1.Image, path string) []byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		data, ok := fromTar(t, rc, path)
		_ = rc.Close()
		if ok {
			return data
		}
	}
	t.Fatalf("no %s in the image", path)
	return nil
}

// fileInTgz returns the file at path in a gzipped tar archive.
func fileInTgz(t *testing.T, archive, path string) []byte {
	t.Helper()
	f, err := os.Open(archive) //nolint:gosec // G304: what helm pull wrote
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	data, ok := fromTar(t, zr, path)
	if !ok {
		t.Fatalf("no %s in %s", path, archive)
	}
	return data
}

func fromTar(t *testing.T, r io.Reader, path string) ([]byte, bool) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, false
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimPrefix(h.Name, "/") == path {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return data, true
		}
	}
}
