//go:build envtest

package webhook

import (
	"cmp"
	"context"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// flaky is a read fault that fails the first failures reads, then lets them through: hang makes
// the first one hang until its context ends, and the rest of the failures answer 503 at once.
// failures < 0 fails every read. calls counts the reads.
func flaky(failures int32, hang bool) (fault func(context.Context) error, calls *atomic.Int32) {
	calls = &atomic.Int32{}
	return func(ctx context.Context) error {
		n := calls.Add(1)
		if failures >= 0 && n > failures {
			return nil
		}
		if hang && n == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return apierrors.NewServiceUnavailable("the API server is overloaded")
	}, calls
}

// retry writes what argo retry does: same UID, the completed label removed, the phase reset.
func retry(t *testing.T, wf *unstructured.Unstructured, phase argo.Phase) {
	t.Helper()
	labels := wf.GetLabels()
	delete(labels, "workflows.argoproj.io/completed")
	wf.SetLabels(labels)
	setPhase(t, wf, phase)
}

// A workflow Succeeded and the guard saw it; it was retried, the guard's watch has not
// delivered the retry, and the API server answers the live read only on the third attempt
// (the first hangs past its attempt timeout, the second fails at once). The whole budget is
// used, and the retried workflow's exit handler runs, with the default store fallback (fresh,
// the watch having just advanced) that would refuse it had no read answered, and with
// completion. No GET beside a slow LIST here: the attempts are the hedge and the retry.
func TestRetriedWorkflowIsAdmittedWhileLiveReadsFailAtFirst(t *testing.T) {
	for _, fallback := range []StoreFallback{"", FallbackCompletion} {
		t.Run("fallback "+cmp.Or(string(fallback), "default"), func(t *testing.T) {
			retriedWorkflowAdmittedOnALateAnswer(t, fallback)
		})
	}
}

func retriedWorkflowAdmittedOnALateAnswer(t *testing.T, fallback StoreFallback) {
	fault, calls := flaky(2, true)
	h := startGuard(t, Options{LiveReadTimeout: 300 * time.Millisecond, LiveReadBudget: 3 * time.Second, GetBesideListAfter: -1, StoreFallback: fallback},
		harnessOptions{noWatch: true, reader: faultyReader(t, fault, fault)})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "retried", argo.PhaseSucceeded)
	h.store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: ns, Name: wf.GetName(),
		ResourceVersion: wf.GetResourceVersion(), Phase: argo.PhaseSucceeded})
	h.store.Progress(wf.GetResourceVersion())
	h.store.NoteLag(0)
	retry(t, wf, argo.PhaseRunning)

	mustAdmit(t, fixture.ExitPod(wf))
	if got := calls.Load(); got != 3 {
		t.Errorf("%d live read attempts, want 3", got)
	}
	for cause, want := range map[string]float64{"hedged": 1, "error": 1} {
		if got := h.counter(t, "exit_guard_live_read_retries_total", map[string]string{"cause": cause}); got != want {
			t.Errorf("live read retries with cause %s = %v, want %v", cause, got, want)
		}
	}
}

// When no live read answers within the budget, the store alone decides, as --store-fallback
// says. Here the workflow was retried and the guard's watch never delivered the retry: the
// worst case of a store fallback. With tombstone a completion only the store holds never
// refuses; with requeue (the default) and completion it always refuses the exit handler (a
// 429: Argo's controller sends it again on its next pass, when the guard can read the
// workflow); with fresh it refuses while the watch advanced within --store-fresh-for, and
// admits once the watch has been quiet longer. A tombstone refuses in every case.
func TestStoreFallbackWhenNoLiveReadAnswers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fallback StoreFallback
		// quiet is how long ago the watch last advanced; 0 means it never did.
		quiet  time.Duration
		denied bool
	}{
		{name: "tombstone: a completion only the store holds admits", fallback: FallbackTombstone, quiet: time.Second, denied: false},
		{name: "default, the watch advanced a second ago: it refuses", quiet: time.Second, denied: true},
		{name: "default, the watch quiet for two minutes: it refuses", quiet: 2 * time.Minute, denied: true},
		{name: "default, the watch never advanced: it refuses", denied: true},
		{name: "fresh, the watch advanced a second ago: it refuses", fallback: FallbackFresh, quiet: time.Second, denied: true},
		{name: "fresh, the watch quiet for two minutes: it admits", fallback: FallbackFresh, quiet: 2 * time.Minute, denied: false},
		{name: "fresh, the watch never advanced: it admits", fallback: FallbackFresh, denied: false},
		{name: "completion, the watch quiet for two minutes: it refuses", fallback: FallbackCompletion, quiet: 2 * time.Minute, denied: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fault, calls := flaky(-1, false)
			clk := clocktesting.NewFakeClock(time.Now())
			h := startGuard(t, Options{StoreFallback: tc.fallback, LiveReadTimeout: 100 * time.Millisecond, LiveReadBudget: 500 * time.Millisecond},
				harnessOptions{noWatch: true, reader: faultyReader(t, fault, fault), storeClock: clk})
			ns := newNamespace(t)
			wf := createWorkflow(t, ns, "retried", argo.PhaseSucceeded)
			h.store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: ns, Name: wf.GetName(),
				ResourceVersion: wf.GetResourceVersion(), Phase: argo.PhaseSucceeded})
			if tc.quiet > 0 {
				h.store.Progress(wf.GetResourceVersion())
				h.store.NoteLag(0)
				clk.Step(tc.quiet)
			}
			retry(t, wf, argo.PhaseUnknown)
			if tc.denied {
				mustDeny(t, fixture.ExitPod(wf), contract.ReasonWorkflowCompleted)
				wantSource(t, wf, sourceStore)
			} else {
				mustAdmit(t, fixture.ExitPod(wf))
				if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"reason": string(contract.ReasonUnconfirmedCompletion)}); got != 1 {
					t.Errorf("unconfirmed-completion decisions = %v, want 1", got)
				}
				if lines := guardLog.Lines(`only the store says its workflow completed`, `"workflowUID":"`+string(wf.GetUID())+`"`); len(lines) != 1 {
					t.Errorf("%d log lines for the unconfirmed completion, want 1", len(lines))
				}
			}
			if calls.Load() < 2 {
				t.Errorf("%d live read attempts in a 500 ms budget, want retries", calls.Load())
			}
			gone := createWorkflow(t, ns, "gone", argo.PhaseSucceeded)
			h.store.Observe(completionstore.Observation{UID: gone.GetUID(), Namespace: ns, Name: gone.GetName(),
				ResourceVersion: gone.GetResourceVersion(), Phase: argo.PhaseSucceeded, Deleted: true})
			mustDeny(t, fixture.ExitPod(gone), contract.ReasonWorkflowDeleted)
			wantSource(t, gone, sourceStore)
		})
	}
}

// The guard is stopped while decisions are in flight: each is still decided on its live read
// and answered, never turned into a store fallback by the shutdown.
func TestShutdownFinishesTheDecisionsInFlight(t *testing.T) {
	var inFlight atomic.Int32
	slow := func(ctx context.Context) error {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
			return nil
		}
	}
	h := startGuard(t, Options{}, harnessOptions{noWatch: true, reader: faultyReader(t, slow, nil)})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() { errs <- env.Client.Create(context.Background(), fixture.ExitPod(wf), client.DryRunAll) }()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true,
			func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("never: %s", what)
		}
	}
	waitFor("every decision in flight", func() bool { return inFlight.Load() == n })
	h.stop()
	for range n {
		if reason, _ := contract.RefusalReason(<-errs); reason != contract.ReasonWorkflowCompleted {
			t.Errorf("a decision in flight at shutdown answered %q, want refused on its live read", reason)
		}
	}
}
