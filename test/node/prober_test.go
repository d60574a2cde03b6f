//go:build node

package node_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// tally counts what a steady stream of pod creates got from the guard, through the API server:
// the exit handler of a workflow that succeeded must be refused, the step of a running one
// admitted. Unjudged are stale exit handlers the API server admitted (the webhook failed open:
// no replica answered in time); failed are steps that did not get through.
type tally struct {
	Refused, Unjudged, Admitted, Failed int
	Errors                              []string    // the first few unexpected answers, with their time
	UnjudgedSent                        []time.Time // when each unjudged request was sent
}

func (t tally) String() string {
	return fmt.Sprintf("stale exit handlers: %d refused, %d unjudged; steps: %d admitted, %d failed", t.Refused, t.Unjudged, t.Admitted, t.Failed)
}

// prober creates, every interval until stopped, one stale exit-handler pod and one step pod in
// ns, as server-side dry runs (the API server calls the webhooks, stores nothing).
type prober struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	t      tally
}

func startProber(t *testing.T, ns string, interval time.Duration) *prober {
	t.Helper()
	return startProbers(t, ns, interval, 1)
}

// startProbers runs workers such streams at once, for requests in flight at any moment.
func startProbers(t *testing.T, ns string, interval time.Duration, workers int) *prober {
	t.Helper()
	succeeded := testenv.CreateWorkflow(t, env.Client, ns, "notify-on-failure-", argo.PhaseSucceeded)
	running := testenv.CreateWorkflow(t, env.Client, ns, "still-running-", argo.PhaseRunning)
	ctx, cancel := context.WithCancel(context.Background())
	p := &prober{cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				p.once(ctx, succeeded, running)
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	go func() { wg.Wait(); close(p.done) }()
	t.Cleanup(func() { p.stop() })
	return p
}

// snapshot returns the tally so far, the stream going on.
func (p *prober) snapshot() tally {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.t
	t.Errors = append([]string(nil), p.t.Errors...)
	t.UnjudgedSent = append([]time.Time(nil), p.t.UnjudgedSent...)
	return t
}

func (p *prober) once(ctx context.Context, succeeded, running *unstructured.Unstructured) {
	sent := time.Now()
	stale := env.Client.Create(ctx, fixture.ExitPod(succeeded), client.DryRunAll)
	step := env.Client.Create(ctx, fixture.StepPod(running), client.DryRunAll)
	if ctx.Err() != nil {
		return // stopped mid-request: not counted
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	note := func(what string, err error) {
		if len(p.t.Errors) < 5 {
			p.t.Errors = append(p.t.Errors, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), what, err))
		}
	}
	switch {
	case contract.IsRefusal(stale):
		p.t.Refused++
	case stale == nil:
		p.t.Unjudged++
		p.t.UnjudgedSent = append(p.t.UnjudgedSent, sent)
		note("stale exit handler admitted", nil)
	default:
		p.t.Unjudged++
		p.t.UnjudgedSent = append(p.t.UnjudgedSent, sent)
		note("stale exit handler", stale)
	}
	if step == nil {
		p.t.Admitted++
	} else {
		p.t.Failed++
		note("step", step)
	}
}

// stop stops the stream and returns its tally.
func (p *prober) stop() tally {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.t
}
