//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// passSteps is how many step pods the workflow of TestArgosPassWithAStaleGuard sends in one
// pass: Argo's controller creates them one after another from one worker.
const passSteps = 16

// wideWorkflow is a workflow whose first step group runs passSteps steps at once.
func wideWorkflow() *unstructured.Unstructured {
	var group []any
	for i := range passSteps {
		group = append(group, map[string]any{"name": fmt.Sprintf("s%02d", i), "template": "work"})
	}
	return newWorkflow("wide-", map[string]any{
		"entrypoint": "main",
		"templates": []any{
			map[string]any{"name": "main", "steps": []any{group}},
			map[string]any{"name": "work", "container": map[string]any{"image": "busybox", "command": []any{"sh", "-c", "echo working"}}},
		},
	})
}

// passFigures is what one run of TestArgosPassWithAStaleGuard measured: the time from the
// first to the last step pod of the pass, and the WorkflowTimedOut Events.
type passFigures struct {
	span     time.Duration
	pods     int
	timedOut int
}

// TestArgosPassWithAStaleGuard: Argo's controller (v3.4.17) sends a pass of passSteps step pods
// while the guard's watch is stale (it has delivered nothing for longer than WatchStaleAfter, 3
// minutes, so step pods are read live) and every live read hangs, as on an API server too
// loaded to answer the guard: each step pod then waits the hook-and-step budget before the
// store decides. Without the guard, with its defaults, and with the budget of exit handlers
// (--hook-step-read-budget=4s: what a step pod waited before). It reports the pass's span and
// asserts no WorkflowTimedOut Event with the defaults (Argo's pass has MAX_OPERATION_TIME, 30 s).
func TestArgosPassWithAStaleGuard(t *testing.T) {
	runs := []struct {
		name string
		mode guardMode
		args []string
	}{
		{"without the guard", noGuard, nil},
		{"with the guard", guardDirect, nil},
		{"with the guard, --hook-step-read-budget=4s", guardDirect, []string{"--hook-step-read-budget=4s"}},
	}
	got := map[string]passFigures{}
	for _, run := range runs {
		t.Run(run.name, func(t *testing.T) {
			var f passFigures
			var wf *unstructured.Unstructured
			runScenario(t, scenario{version: "v3.4.17", mode: run.mode, direct: true, guardProxy: run.mode != noGuard, guardArgs: run.args,
				drive: func(ctx context.Context, t *testing.T, r rig) []*unstructured.Unstructured {
					if r.proxy != nil {
						r.proxy.Stall.Store(true)
						r.proxy.HangReads.Store(true)
						waitWatchStale(ctx, t, r.g)
					}
					wf = wideWorkflow()
					if err := r.c.Create(ctx, wf); err != nil {
						t.Fatal(err)
					}
					return []*unstructured.Unstructured{wf}
				},
				afterRun: func(ctx context.Context, r rig, _ []*unstructured.Unstructured) {
					times := r.k.podTimes(wf.GetName(), "")
					slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
					if len(times) > 0 {
						f.span, f.pods = times[len(times)-1].Sub(times[0]), len(times)
					}
					f.timedOut = testenv.CountEvents(ctx, t, r.c, testenv.EventsAbout{Namespace: namespace, Name: wf.GetName(), UID: wf.GetUID(), Reason: "WorkflowTimedOut"})
					if p := phase(ctx, r.c, wf); p != argo.PhaseSucceeded {
						t.Errorf("the workflow ended %q, want Succeeded", p)
					}
				}})
			got[run.name] = f
			t.Logf("RESULT Argo v3.4.17's pass of %d step pods %s (the guard's watch stale, its reads hanging): %d pods, first to last %v, WorkflowTimedOut Events %d",
				passSteps, run.name, f.pods, f.span.Round(10*time.Millisecond), f.timedOut)
			if f.pods != passSteps {
				t.Errorf("%d step pods created, want %d", f.pods, passSteps)
			}
			if run.args == nil && f.timedOut != 0 {
				t.Errorf("%d WorkflowTimedOut Events: the pass ran out of time", f.timedOut)
			}
		})
	}
}

// waitWatchStale waits until the guard's watch has not advanced for longer than
// WatchStaleAfter (3 minutes), as its metrics tell.
func waitWatchStale(ctx context.Context, t *testing.T, g *testenv.Guard) {
	t.Helper()
	const staleAfter = 3 * time.Minute
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, staleAfter+time.Minute, false, func(ctx context.Context) (bool, error) {
		mfs, err := g.Metrics(ctx)
		if err != nil {
			return false, nil
		}
		at := testenv.SumSeries(mfs, "exit_guard_watch_last_progress_timestamp_seconds", nil)
		return at > 0 && time.Since(time.Unix(int64(at), 0)) > staleAfter+5*time.Second, nil
	}); err != nil {
		t.Fatalf("the guard's watch never went stale behind the stalled proxy: %v", err)
	}
}
