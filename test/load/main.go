// Command load measures what exit-guard costs, on loopback only, against a local API server
// (the envtest binaries of hack/envtest-binaries.sh) and the real exit-guard binary. Every run
// is bounded in count and time. `make load` runs it; docs/evidence/performance.md holds its results.
//
//	load apiserver  exit-handler pod creates through the API server, side by side: no webhook,
//	              two webhooks that admit everything at once (the floor), exit-guard (default
//	              and --store-first), a webhook that GETs the owner on every call, a
//	              ValidatingAdmissionPolicy with Workflows as params; at growing numbers of
//	              retained workflows
//	load webhook  the guard's webhook alone over TLS at fixed rates, by kind of decision, beside
//	              the two floors
//	load startup  time to Ready and peak and steady RSS after a restart, with N retained
//	              workflows, next to watchers of whole objects over the same workflows
//	load watch    CPU to absorb a burst of updates of large workflows, the guard's watch next
//	              to watchers of whole objects
//
// Each scenario prints a Markdown table and checks what it can of correctness: a run whose
// watchers never see every workflow, or whose guard decides wrong, fails.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

func main() {
	// controller-runtime's own log would say nothing useful here.
	ctrllog.SetLogger(logr.Discard())
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "startup":
		err = runStartup(os.Args[2:])
	case "watch":
		err = runWatch(os.Args[2:])
	case "webhook":
		err = runWebhook(os.Args[2:])
	case "apiserver":
		err = runAPIServer(os.Args[2:])
	case "roles":
		err = runRoles(os.Args[2:])
	case watcherCommand:
		err = runWatcher(os.Args[2:])
	case liveGetCommand:
		err = runLiveGet(os.Args[2:])
	case floorCommand:
		err = runFloor(os.Args[2:])
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "load %s FAILED: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: load apiserver|roles|webhook|startup|watch [flags]   (load <scenario> -h lists the flags)")
}

// common flags of the scenarios.
type common struct {
	guard   string
	timeout time.Duration
}

func (c *common) register(fs *flag.FlagSet, timeout time.Duration) {
	fs.StringVar(&c.guard, "guard", "bin/exit-guard", "The exit-guard binary (make build).")
	fs.DurationVar(&c.timeout, "timeout", timeout, "The whole run's time limit.")
}

func (c *common) context() (context.Context, context.CancelFunc, error) {
	if _, err := os.Stat(c.guard); err != nil {
		return nil, nil, fmt.Errorf("no exit-guard binary at %s: run 'make build' (or pass --guard)", c.guard)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	return ctx, cancel, nil
}

var errTimeout = errors.New("the run went past its --timeout")

// startAPIServer starts a local API server (and etcd), with the guard's webhook registered on
// its default serving address when guardWebhook, and returns it with a client that has no
// client-side rate limit. Stop it when done.
func startAPIServer(guardWebhook bool) (*testenv.Env, client.Client, error) {
	var opts testenv.Options
	if guardWebhook {
		vwc, err := testenv.GuardWebhook()
		if err != nil {
			return nil, nil, err
		}
		opts.ValidatingWebhooks = []*admissionregistrationv1.ValidatingWebhookConfiguration{vwc}
	}
	env, err := testenv.Start(opts)
	if err != nil {
		return nil, nil, err
	}
	cl, err := fastClient(env)
	if err != nil {
		return nil, nil, errors.Join(err, env.Stop())
	}
	return env, cl, nil
}
