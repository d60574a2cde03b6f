package testenv

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

var versions = sync.OnceValues(func() (map[string]string, error) {
	path := filepath.Join(RepoRoot(), "hack", "versions.env")
	f, err := os.Open(path) //nolint:gosec // G304: the repository's own file
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not NAME=value", path, line)
		}
		out[name] = value
	}
	return out, sc.Err()
})

// Version is the version name (KUBE_VERSION, HELM_VERSION, …) of hack/versions.env, where
// every version the project builds and tests with is written once. It panics if the file or
// the name is missing: a broken checkout, not a test failure.
func Version(name string) string {
	v, err := versions()
	if err != nil {
		panic(fmt.Sprintf("reading hack/versions.env: %v", err))
	}
	if v[name] == "" {
		panic("hack/versions.env has no " + name)
	}
	return v[name]
}

// KubeVersion is the Kubernetes version the chart is rendered for, without the "v":
// helm's --kube-version. It is hack/versions.env's, or $KUBE_VERSION where the run says which
// API server it built (make compat runs the chart's tests on each minor the chart supports;
// TestTheAPIServerIsTheVersionRenderedFor holds the two together).
func KubeVersion() string {
	if v := os.Getenv("KUBE_VERSION"); v != "" {
		return strings.TrimPrefix(v, "v")
	}
	return strings.TrimPrefix(Version("KUBE_VERSION"), "v")
}
