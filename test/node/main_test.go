//go:build node

// Package node_test runs the chart, the guard's image and Argo on a real node (make e2e-node):
// a kubelet on containerd and runc, with kube-scheduler and kube-controller-manager, on the
// test API server (test/support/node).
package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exit-guard/exit-guard/test/support/node"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var (
	env     *testenv.Env
	cluster *node.Cluster
)

// images is where hack/node-images.sh wrote the images (make e2e-node: NODE_IMAGES).
func images() string {
	if d := os.Getenv("EXIT_GUARD_NODE_IMAGES"); d != "" {
		return d
	}
	return filepath.Join(testenv.RepoRoot(), "bin", "node-images")
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if err := node.CheckIsolated(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	apiLog, err := os.CreateTemp("", "exit-guard-node-apiserver-*.log")
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	defer func() { _ = os.Remove(apiLog.Name()) }()
	opts := node.Options()
	opts.APIServerOutput = apiLog
	e, err := testenv.Start(opts)
	if err != nil {
		raw, _ := os.ReadFile(apiLog.Name())
		fmt.Fprintf(os.Stderr, "FAIL: %v\nkube-apiserver's output:\n%s\n", err, tailLines(string(raw), 30))
		return 1
	}
	env = e
	defer func() { _ = e.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	started := time.Now()
	c, err := node.Start(ctx, e)
	code := 0
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: starting the node: %v\n", err)
		code = 1
	} else {
		fmt.Printf("node %s Ready in %s\n", node.Name, time.Since(started).Round(time.Millisecond))
		cluster = c
		for _, img := range []string{"pause.tar", "exit-guard.tar"} {
			if err := c.Import(ctx, filepath.Join(images(), img)); err != nil {
				fmt.Fprintf(os.Stderr, "FAIL: %v (make e2e-node builds the images with hack/node-images.sh)\n", err)
				code = 1
			}
		}
		if code == 0 {
			code = m.Run()
		}
	}
	if c != nil {
		if err := c.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: stopping the node: %v\n", err)
			code = 1
		}
		if err := c.Check(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: the node left things behind: %v\n", err)
			code = 1
		}
	}
	return code
}
