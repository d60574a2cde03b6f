//go:build e2e

package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// alwaysNotifyWorkflow is the reference workflow whose exit handler notifies whatever the
// outcome: a Succeeded workflow retried for its exit handler alone runs it again.
func alwaysNotifyWorkflow() *unstructured.Unstructured {
	wf := referenceWorkflow(false)
	wf.SetGenerateName("notify-always-")
	for _, tmpl := range wf.Object["spec"].(map[string]any)["templates"].([]any) {
		if tm := tmpl.(map[string]any); tm["name"] == "exit-handler" {
			step := tm["steps"].([]any)[0].([]any)[0].(map[string]any)
			delete(step, "when")
		}
	}
	return wf
}

// wrongRefusal is what a run of TestAWrongRefusalWaits saw.
type wrongRefusal struct {
	// refusals of the retried workflow's exit handler after the retry (the guard's log).
	refusals int
	// waited is the time from the retry's write to the exit-handler pod's creation (the
	// kubelet stand-in sees a pod within 200 ms).
	waited time.Duration
	// overturned is the guard's exit_guard_refusals_overturned_total, and overturnEvents its
	// RefusalOverturned Events on the workflow.
	overturned     float64
	overturnEvents int
}

// A wrong refusal waits, it does not fail. A Succeeded workflow is retried for its exit handler
// alone (as `argo retry --restart-successful --node-field-selector` does on 3.6 and later; the
// v3.4.17 CLI refuses a Succeeded workflow, so the test writes the retry, as retryWorkflow
// does) while the guard cannot know: its reads of the workflow hang and its watch is held back
// just after a write it saw, so its store holds the completion. The controller re-runs the
// exit handler; the guard refuses it from the store (the default --store-fallback=requeue
// refuses an exit handler of a completion the store holds, however old). The refusal is a 429:
// the node stays Pending, and Argo tries again on each pass, refused again, until the guard
// can read the workflow (the fault lifted after cutOff); then the exit handler runs. The
// guard's watch catches up, sees the workflow running after it refused, counts the refusal
// overturned and records a RefusalOverturned Event. With a 403 the exit node would become
// Error and the workflow would end Error without its exit handler.
func TestAWrongRefusalWaits(t *testing.T) {
	for _, c := range []struct {
		requeue string
		cutOff  time.Duration
	}{
		// Each cut-off outlasts --store-fresh-for (5 s) by a pass at least, so that a guard
		// that refused only while its store was fresh would admit the exit handler before the
		// fault lifts (seen with --store-fallback=fresh). At Argo's default requeue v3.4.17
		// first creates the retried exit handler on its next pass, 10 s after the retry's
		// write, and again 11 s later.
		{"1s", 10 * time.Second}, {"10s", 25 * time.Second},
	} {
		requeue, cutOff := c.requeue, c.cutOff
		t.Run("v3.4.17, requeue "+requeue, func(t *testing.T) {
			var seen wrongRefusal
			runScenario(t, scenario{version: "v3.4.17", mode: guardDirect, direct: true, guardProxy: true,
				// Reads that hang cost the live-read budget before the store decides: a short
				// one keeps Argo's passes close to its requeue.
				guardArgs: []string{"--live-read-timeout=300ms", "--live-read-budget=1s"},
				env:       []string{"DEFAULT_REQUEUE_TIME=" + requeue},
				drive: func(ctx context.Context, t *testing.T, r rig) []*unstructured.Unstructured {
					seen = driveWrongRefusal(ctx, t, r, cutOff)
					return nil
				}})
			t.Logf("RESULT a wrong refusal on v3.4.17, requeue %s, the guard cut off for %s: the retried exit handler refused %d time(s), ran %v after the retry; refusals overturned %v, RefusalOverturned Events %d",
				requeue, cutOff, seen.refusals, seen.waited.Round(10*time.Millisecond), seen.overturned, seen.overturnEvents)
			if seen.refusals == 0 {
				t.Errorf("the retried exit handler was not refused: the run shows nothing of a wrong refusal")
			}
			if seen.overturned < 1 || seen.overturnEvents < 1 {
				t.Errorf("the wrong refusal went unnoticed: overturned %v, RefusalOverturned Events %d", seen.overturned, seen.overturnEvents)
			}
		})
	}
}

// driveWrongRefusal runs the scenario of TestAWrongRefusalWaits and checks its workflow.
func driveWrongRefusal(ctx context.Context, t *testing.T, r rig, cutOff time.Duration) wrongRefusal {
	t.Helper()
	var out wrongRefusal
	wf := alwaysNotifyWorkflow()
	if err := r.c.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	name := wf.GetName()
	poll := func(what string, timeout time.Duration, done func(ctx context.Context) bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
			return done(ctx), nil
		}); err != nil {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
	}
	poll("the workflow to succeed with its exit handler", 2*time.Minute, func(ctx context.Context) bool {
		return phase(ctx, r.c, wf) == argo.PhaseSucceeded && len(r.k.pods(name, ".onExit")) == 1
	})
	// A write the guard's watch delivers, so that its store counts itself close behind.
	touched := time.Now()
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(argo.WorkflowGVK)
	if err := r.c.Get(ctx, client.ObjectKeyFromObject(wf), cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	labels := cur.GetLabels()
	labels["e2e.exit-guard.io/touched"] = "true"
	cur.SetLabels(labels)
	if err := r.c.Patch(ctx, cur, patch); err != nil {
		t.Fatal(err)
	}
	poll("the guard's watch to deliver the write", 10*time.Second, func(ctx context.Context) bool {
		mfs, err := r.g.Metrics(ctx)
		return err == nil && testenv.SumSeries(mfs, "exit_guard_watch_last_progress_timestamp_seconds", nil) >= float64(touched.Unix())
	})
	before, _ := refusalsLogged(r.guardLog, wf.GetUID())
	r.proxy.Stall.Store(true)
	r.proxy.HangReads.Store(true)
	retried := time.Now()
	retryWorkflow(ctx, t, r.c, wf)
	select {
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	case <-time.After(cutOff):
	}
	if n := len(r.k.pods(name, ".onExit")); n != 1 {
		t.Errorf("%d exit-handler pods while the guard was cut off, want the first run's alone: the store admitted the retry's", n)
	}
	r.proxy.Stall.Store(false)
	r.proxy.HangReads.Store(false)
	poll("the retried exit handler to run", 2*time.Minute, func(context.Context) bool {
		return len(r.k.pods(name, ".onExit")) >= 2
	})
	times := r.k.podTimes(name, ".onExit")
	out.waited = slices.MaxFunc(times, func(a, b time.Time) int { return a.Compare(b) }).Sub(retried)
	all, _ := refusalsLogged(r.guardLog, wf.GetUID())
	out.refusals = all - before
	// The guard notices on its next decision about the workflow or its sweep (every 5 s).
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		mfs, err := r.g.Metrics(ctx)
		if err == nil {
			out.overturned = testenv.SumSeries(mfs, "exit_guard_refusals_overturned_total", nil)
		}
		out.overturnEvents = overturnEvents(ctx, t, r.c, wf)
		return out.overturned >= 1 && out.overturnEvents >= 1, nil
	})
	poll("the retried workflow to succeed", 2*time.Minute, func(ctx context.Context) bool {
		return phase(ctx, r.c, wf) == argo.PhaseSucceeded
	})
	if p := phase(ctx, r.c, wf); p != argo.PhaseSucceeded {
		t.Errorf("the retried workflow ended %s, want Succeeded", p)
	}
	return out
}

// overturnEvents counts the guard's RefusalOverturned Events about wf.
func overturnEvents(ctx context.Context, t *testing.T, c client.Client, wf *unstructured.Unstructured) int {
	return testenv.CountEvents(ctx, t, c, testenv.EventsAbout{Namespace: namespace, Name: wf.GetName(), UID: wf.GetUID(), Reason: contract.EventReasonRefusalOverturned})
}
