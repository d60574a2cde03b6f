// Command image builds exit-guard's container image without a container engine, from binaries
// built by `go build`, into an OCI image layout; and pushes such a layout to a registry. The
// image is the one the Dockerfile builds: one layer holding the static binary /exit-guard, run
// as user 65532 with /exit-guard as its entrypoint, on no base image.
//
//	go run ./hack/image build --out bin/image --tag ghcr.io/exit-guard/exit-guard:0.1.0 --arch amd64 --arch arm64
//	go run ./hack/image push --layout bin/image --to registry.example.com/platform/exit-guard:0.1.0
//	go run ./hack/image digests --layout bin/image
//	go run ./hack/image archive --layout bin/image --out bin/image.tar
//	go run ./hack/image files --out bin/pause --tag exit-guard.local/pause:1 --file /pause=bin/pause --entrypoint /pause
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What the image is, as in the Dockerfile.
const (
	binaryPath = "exit-guard" // in the root of the image
	user       = "65532:65532"
	refName    = "org.opencontainers.image.ref.name"
)

// arch is one platform of the image and the binary built for it.
type arch struct {
	name   string // GOARCH
	binary []byte
}

// buildImage returns the image of one platform: a single layer with the binary, and a config
// that runs it as user 65532. Every timestamp is the Unix epoch, so that the same binary gives
// the same digest.
func buildImage(a arch, version string) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: binaryPath, Mode: 0o755, Size: int64(len(a.binary)),
		Uid: 0, Gid: 0, ModTime: time.Unix(0, 0), Format: tar.FormatPAX,
	}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(a.binary); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return oneLayer(buf.Bytes(), "COPY --from=build /exit-guard /exit-guard", a.name, func(c *v1.Config) {
		c.User = user
		c.Entrypoint = []string{"/" + binaryPath}
		c.Labels = map[string]string{
			"org.opencontainers.image.title":   "exit-guard",
			"org.opencontainers.image.version": version,
			"org.opencontainers.image.source":  "https://github.com/exit-guard/exit-guard",
		}
	})
}

// oneLayer returns a linux/goarch image of the one layer layerTar, its config set by
// configure, every timestamp the Unix epoch and its working directory /.
func oneLayer(layerTar []byte, createdBy, goarch string, configure func(*v1.Config)) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		CreatedBy: createdBy, Created: v1.Time{Time: time.Unix(0, 0)},
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goarch
	cf.Created = v1.Time{Time: time.Unix(0, 0)}
	cf.Config.WorkingDir = "/"
	configure(&cf.Config)
	return mutate.ConfigFile(img, cf)
}

// buildIndex returns the multi-platform image of the binaries.
func buildIndex(archs []arch, version string) (v1.ImageIndex, error) {
	if len(archs) == 0 {
		return nil, errors.New("no binary given")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, a := range archs {
		img, err := buildImage(a, version)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a.name, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: a.name},
		}})
	}
	return idx, nil
}

// writeLayout writes idx into an OCI image layout at dir (replacing one there), named tag.
func writeLayout(dir, tag string, idx v1.ImageIndex) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refName: tag}))
}

// readLayout returns the image index written by writeLayout.
func readLayout(dir string) (v1.ImageIndex, error) {
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("%s holds %d images, want 1", dir, len(m.Manifests))
	}
	return top.ImageIndex(m.Manifests[0].Digest)
}

// buildBinary builds the guard from the module at root for linux/goarch as the Dockerfile does
// (static: no cgo; no paths or symbols of the build machine; the version, commit and date
// that --version prints, from ldflags) into dir, and returns it.
func buildBinary(root, goarch, dir, ldflags string) (arch, error) {
	out := filepath.Join(dir, "linux-"+goarch, binaryPath)
	goBin := os.Getenv("GO") // the go command make and hack/release.sh name; go on the PATH otherwise
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags", strings.TrimSpace("-s -w "+ldflags), "-o", out, ".") //nolint:gosec // G204: go build of this repository
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return arch{}, fmt.Errorf("go build for linux/%s: %w\n%s", goarch, err, msg)
	}
	raw, err := os.ReadFile(out) //nolint:gosec // G304: what go build just wrote
	if err != nil {
		return arch{}, err
	}
	return arch{name: goarch, binary: raw}, nil
}

// digests lists the digest of the index ("index sha256:…") and of each platform's image
// ("linux/amd64 sha256:…"), a line each: what the release signs and attests.
func digests(idx v1.ImageIndex) ([]string, error) {
	d, err := idx.Digest()
	if err != nil {
		return nil, err
	}
	lines := []string{"index " + d.String() + "\n"}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, desc := range m.Manifests {
		if desc.Platform == nil {
			return nil, fmt.Errorf("the index's manifest %s names no platform", desc.Digest)
		}
		lines = append(lines, desc.Platform.OS+"/"+desc.Platform.Architecture+" "+desc.Digest.String()+"\n")
	}
	return lines, nil
}

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: image build|push|digests|files|archive [flags]")
	}
	fs := flag.NewFlagSet("image "+args[0], flag.ContinueOnError)
	switch args[0] {
	case "build":
		var goarchs list
		out := fs.String("out", "bin/image", "The OCI image layout to write.")
		tag := fs.String("tag", "ghcr.io/exit-guard/exit-guard:latest", "The image's name in the layout (org.opencontainers.image.ref.name).")
		version := fs.String("version", "dev", "The version label of the image.")
		ldflags := fs.String("ldflags", "", "Further -ldflags of the go build (make image sets the version, commit and date --version prints).")
		fs.Var(&goarchs, "arch", "A GOARCH to build for (linux); repeat for more platforms (default: this machine's).")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if len(goarchs) == 0 {
			goarchs = list{runtime.GOARCH}
		}
		root, err := os.Getwd()
		if err != nil {
			return err
		}
		var bins []arch
		for _, a := range goarchs {
			b, err := buildBinary(root, a, filepath.Join(filepath.Dir(*out), "image-build"), *ldflags)
			if err != nil {
				return err
			}
			bins = append(bins, b)
		}
		idx, err := buildIndex(bins, *version)
		if err != nil {
			return err
		}
		if err := writeLayout(*out, *tag, idx); err != nil {
			return err
		}
		d, err := idx.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("wrote %s (%s, %d platforms) to %s\n", *tag, d, len(bins), *out)
		return nil
	case "push":
		dir := fs.String("layout", "bin/image", "The OCI image layout that `image build` wrote.")
		to := fs.String("to", "", "Where to push, registry/repository:tag; credentials come from your docker config (docker login, or the registry's credential helper).")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		ref, err := name.ParseReference(*to)
		if err != nil {
			return fmt.Errorf("--to: %w", err)
		}
		idx, err := readLayout(*dir)
		if err != nil {
			return err
		}
		if err := remote.WriteIndex(ref, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return err
		}
		d, err := idx.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("pushed %s@%s\n", ref.Context(), d)
		return nil
	case "digests":
		dir := fs.String("layout", "bin/image", "The OCI image layout that `image build` wrote.")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		idx, err := readLayout(*dir)
		if err != nil {
			return err
		}
		lines, err := digests(idx)
		if err != nil {
			return err
		}
		fmt.Print(strings.Join(lines, ""))
		return nil
	case "files":
		return runFiles(fs, args[1:])
	case "archive":
		dir := fs.String("layout", "bin/image", "The OCI image layout to archive.")
		out := fs.String("out", "", "The tar file to write, for `ctr images import`.")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *out == "" {
			return errors.New("image archive: --out is required")
		}
		return writeArchive(*dir, *out)
	default:
		return fmt.Errorf("unknown command %q: want build, push, digests, files or archive", args[0])
	}
}
