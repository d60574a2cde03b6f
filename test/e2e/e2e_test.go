//go:build e2e

// Package e2e proves exit-guard on real Argo workflow-controllers: it reproduces the stale
// exit handler on an exposed controller, then shows the guard refusing it. Run it with
// `make e2e-argo` (E2E_TRIES workflows per run, default 5); docs/evidence/argo-e2e.md has the figures.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

const (
	namespace = "argo-e2e"
	// watchLag is how late the controller's Workflow watch events arrive. It must exceed the
	// gap between the last incomplete write and completion plus podGC's 5 s delay.
	watchLag = 9 * time.Second
	// settle is how long a run waits after its last workflow completed for a stale replay.
	settle = 30 * time.Second
)

var guardBin string

func TestMain(m *testing.M) {
	// The test's clients log the API server's warnings through controller-runtime.
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	dir, err := os.MkdirTemp("", "exit-guard-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if guardBin, err = testenv.BuildGuard(dir); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 && runs.Load() == 0 && flag.Lookup("test.list").Value.String() == "" {
		// A -run pattern (E2E_RUN) that matches nothing must not pass as a proof.
		fmt.Fprintln(os.Stderr, "FAIL: no run of the proof started: the -run pattern (E2E_RUN) matched no test")
		code = 1
	}
	os.Exit(code)
}

// runs counts the runs of the proof started (runScenario).
var runs atomic.Int32

func tries(t *testing.T) int {
	t.Helper()
	n := 5
	if s := os.Getenv("E2E_TRIES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("E2E_TRIES=%q: want a positive number", s)
		}
	}
	return n
}
