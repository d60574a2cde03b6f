//go:build envtest

package main

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// TestMain lets the test binary be its own watcher child, as the load command is (startWatcher
// runs os.Executable()).
func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	if len(os.Args) > 1 {
		child := map[string]func([]string) error{watcherCommand: runWatcher, liveGetCommand: runLiveGet, floorCommand: runFloor}[os.Args[1]]
		if child != nil {
			if err := child(os.Args[2:]); err != nil {
				_, _ = os.Stderr.WriteString(err.Error() + "\n")
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

// The smoke runs of make load's scenarios, small: they assert only what each scenario checks
// of correctness (the guard Ready with every retained workflow in its store, the exit handler
// of a Succeeded workflow refused after the restart and that of a running one admitted; each
// role's write of a running workflow admitted and reaching its webhook once, beside the
// do-nothing webhook and through two replicas; every watcher caught up with the burst, the guard's store holding each completion; side by side,
// no policy refusing the exit handler of a running workflow and every one refusing that of a
// Succeeded workflow, and the pods the guard's policy does not concern never sent to it, by
// the API server's own counters). No timing is asserted.
func TestLoadSmoke(t *testing.T) {
	if _, err := testenv.AssetsDir(); err != nil {
		t.Fatal(err)
	}
	guard, err := testenv.BuildGuard(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("startup", func(t *testing.T) {
		if err := runStartup([]string{"--guard=" + guard, "--workflows=300", "--size-kb=8", "--large-kb=100", "--large-every=50", "--settle=0s", "--timeout=5m"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("apiserver", func(t *testing.T) {
		if err := runAPIServer([]string{"--guard=" + guard, "--retained=0,100", "--rounds=30", "--timeout=5m"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("roles", func(t *testing.T) {
		if err := runRoles([]string{"--guard=" + guard, "--retained=0,50", "--rounds=5", "--timeout=5m"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("webhook", func(t *testing.T) {
		if err := runWebhook([]string{"--guard=" + guard, "--rates=50", "--live-read-rates=20", "--duration=1s", "--under-load-rate=20", "--load-workflows=50", "--load-workers=2", "--timeout=5m"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("watch", func(t *testing.T) {
		if err := runWatch([]string{"--guard=" + guard, "--workflows=4", "--size-kb=100", "--writes=3", "--idle=1s", "--timeout=5m"}); err != nil {
			t.Fatal(err)
		}
	})
}
