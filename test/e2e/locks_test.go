//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// withMutex gives wf a workflow-level mutex.
func withMutex(wf *unstructured.Unstructured, name string) {
	wf.Object["spec"].(map[string]any)["synchronization"] = map[string]any{"mutex": map[string]any{"name": name}}
}

// waitingOn is what wf's status says of its phase and its locks, as Argo's controller wrote it.
func waitingOn(ctx context.Context, c client.Client, wf *unstructured.Unstructured) string {
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(argo.WorkflowGVK)
	if err := c.Get(ctx, client.ObjectKeyFromObject(wf), got); err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	msg, _, _ := unstructured.NestedString(got.Object, "status", "message")
	ph, _, _ := unstructured.NestedString(got.Object, "status", "phase")
	sync, _, _ := unstructured.NestedMap(got.Object, "status", "synchronization")
	raw, _ := json.Marshal(sync)
	return fmt.Sprintf("phase %q, message %q, synchronization %s", ph, msg, raw)
}

// follower is what became of a workflow created on the run's mutex after the run.
type follower struct {
	waited   time.Duration // until it Succeeded, or until the limit
	done     bool
	seen     string // its status while it waited (first seen)
	restart  bool   // it waited past the limit and the controller was restarted
	afterRst time.Duration
	doneRst  bool
	// stuck is the guard's exit_guard_sync_stuck_workflows by cause, read before the restart
	// (or once the follower completed).
	stuck map[string]float64
}

// followerLimit is how long a follower may wait before the run restarts the controller;
// lockStuckAfter is the guard's --lock-stuck-after in these runs.
const (
	followerLimit  = 150 * time.Second
	lockStuckAfter = 30 * time.Second
)

// waitFor polls wf until it ends Succeeded or limit passes; seen gets its first waiting status.
func waitFor(ctx context.Context, c client.Client, wf *unstructured.Unstructured, limit time.Duration, seen *string) (time.Duration, bool) {
	start := time.Now()
	succeeded := false
	_ = wait.PollUntilContextTimeout(ctx, time.Second, limit, true, func(ctx context.Context) (bool, error) {
		if p := phase(ctx, c, wf); p.Terminal() {
			succeeded = p == argo.PhaseSucceeded
			return true, nil
		}
		if s := waitingOn(ctx, c, wf); *seen == "" && time.Since(start) > 10*time.Second {
			*seen = s
		}
		return false, nil
	})
	return time.Since(start), succeeded
}

// Held locks: the reference workflows on one workflow-level mutex, then a follower on it. A
// stale pass of a completed workflow takes the free mutex in the controller's memory (or
// queues for it) and its write fails: does the follower wait, how long, what does its status
// say, and does a restart of the controller (the remedy) free it? On v3.4.17 and v3.6.18, with
// the guard off and on.
func TestHeldLocks(t *testing.T) {
	n := tries(t)
	for _, version := range []string{"v3.4.17", "v3.6.18"} {
		for _, mode := range []guardMode{noGuard, guardDirect} {
			what := version + ", a workflow-level mutex, " + map[guardMode]string{noGuard: "without the guard", guardDirect: "with the guard"}[mode]
			t.Run(what, func(t *testing.T) {
				var f follower
				outs := runScenario(t, scenario{version: version, mode: mode, ok: n, failing: 1, mutex: "probe",
					afterRun: func(ctx context.Context, r rig, _ []*unstructured.Unstructured) {
						c, g := r.c, r.g
						wf := referenceWorkflow(false)
						wf.SetGenerateName("follower-")
						withMutex(wf, "probe")
						if err := c.Create(ctx, wf); err != nil {
							t.Fatal(err)
						}
						f.waited, f.done = waitFor(ctx, c, wf, followerLimit, &f.seen)
						mfs, err := g.Metrics(ctx)
						if err != nil {
							t.Fatal(err)
						}
						f.stuck = map[string]float64{}
						for _, cause := range []string{"free-not-granted", "held-by-completed"} {
							f.stuck[cause] = testenv.SumSeries(mfs, "exit_guard_sync_stuck_workflows", map[string]string{"cause": cause})
						}
						if f.done {
							return
						}
						f.restart = true
						r.restart()
						var seen string
						f.afterRst, f.doneRst = waitFor(ctx, c, wf, 90*time.Second, &seen)
					}})
				report(t, what, outs)
				incomplete := 0
				for _, o := range outs {
					if !o.phase.Terminal() {
						incomplete++
					}
				}
				t.Logf("RESULT %s: %d of %d workflows of the run did not complete; the follower %s after %s; while waiting: %s",
					what, incomplete, len(outs), map[bool]string{true: "Succeeded", false: "was still waiting"}[f.done], f.waited.Round(time.Second), f.seen)
				t.Logf("RESULT %s: the guard's exit_guard_sync_stuck_workflows: %v", what, f.stuck)
				if (incomplete > 0 || f.restart) && f.stuck["free-not-granted"]+f.stuck["held-by-completed"] == 0 {
					t.Errorf("workflows waited on the mutex for good, and the guard's lock scan reported none of them")
				}
				if incomplete == 0 && !f.restart && f.stuck["free-not-granted"]+f.stuck["held-by-completed"] > 0 {
					t.Errorf("every workflow got the mutex, yet the guard's lock scan reported stuck waiters: %v", f.stuck)
				}
				if f.restart {
					t.Logf("RESULT %s: after a restart of the controller the follower %s in %s", what,
						map[bool]string{true: "Succeeded", false: "was still waiting"}[f.doneRst], f.afterRst.Round(time.Second))
					if !f.doneRst {
						t.Errorf("the follower still waited 90 s after the controller's restart: the documented remedy does not work")
					}
				}
			})
		}
	}
}
