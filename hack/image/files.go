package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What `image files` and `image archive` are for: the images of the real node (make e2e-node),
// where no registry can be reached: its pause image, Argo's controller and executor, a main
// image with busybox. Each is one layer of the given files, for this machine's platform.

// filesImage returns an image of one layer: each entry of files is IMAGEPATH=LOCALFILE, each of
// links IMAGEPATH=TARGET (a symbolic link). Timestamps are the Unix epoch.
func filesImage(files, links, env []string, entrypoint []string, user string) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	mkdirs := func(p string) error {
		var parts []string
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			parts = append([]string{d}, parts...)
		}
		for _, d := range parts {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/",
				Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, f := range files {
		in, local, ok := strings.Cut(f, "=")
		if !ok || !path.IsAbs(in) {
			return nil, fmt.Errorf("--file %q: want /path/in/image=local-file", f)
		}
		raw, err := os.ReadFile(local) //nolint:gosec // G304: the files the command line names
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(local) //nolint:gosec // G703: the files the command line names
		if err != nil {
			return nil, err
		}
		if err := mkdirs(in); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(in, "/"),
			Mode: int64(st.Mode().Perm()), Size: int64(len(raw)), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(raw); err != nil {
			return nil, err
		}
	}
	for _, l := range links {
		in, target, ok := strings.Cut(l, "=")
		if !ok || !path.IsAbs(in) || target == "" {
			return nil, fmt.Errorf("--link %q: want /path/in/image=target", l)
		}
		if err := mkdirs(in); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(in, "/"), Linkname: target,
			Mode: 0o777, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return oneLayer(buf.Bytes(), "image files", runtime.GOARCH, func(c *v1.Config) {
		c.User, c.Entrypoint, c.Env = user, entrypoint, env
	})
}

// writeArchive writes the OCI image layout at dir as a tar file (what `ctr images import`
// reads), entries sorted by path.
func writeArchive(dir, out string) error {
	f, err := os.Create(out) //nolint:gosec // G304: the file the command line names
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: rel + "/", Mode: 0o755, ModTime: time.Unix(0, 0)})
		}
		raw, err := os.ReadFile(p) //nolint:gosec // G304: a file of the layout
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o644, Size: int64(len(raw)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err = tw.Write(raw)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// runFiles is `image files`.
func runFiles(fs *flag.FlagSet, args []string) error {
	var files, links, env, entrypoint list
	out := fs.String("out", "", "The OCI image layout to write.")
	tag := fs.String("tag", "", "The image's name (org.opencontainers.image.ref.name), as pods name it.")
	archive := fs.String("archive", "", "Also write the layout as this tar file, for `ctr images import`.")
	user := fs.String("user", "", "The user the image runs as (default root).")
	fs.Var(&files, "file", "IMAGEPATH=LOCALFILE: a file of the image; repeat.")
	fs.Var(&links, "link", "IMAGEPATH=TARGET: a symbolic link of the image; repeat.")
	fs.Var(&env, "env", "NAME=VALUE in the image's environment; repeat.")
	fs.Var(&entrypoint, "entrypoint", "The entrypoint, one argument a flag; repeat.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *tag == "" || len(files) == 0 {
		return errors.New("image files: --out, --tag and at least one --file are required")
	}
	img, err := filesImage(files, links, env, entrypoint, *user)
	if err != nil {
		return err
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{
		Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}},
	})
	if err := writeLayout(*out, *tag, idx); err != nil {
		return err
	}
	if *archive != "" {
		if err := writeArchive(*out, *archive); err != nil {
			return err
		}
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s) to %s\n", *tag, d, *out)
	return nil
}
