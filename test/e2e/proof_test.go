//go:build e2e

package e2e

import (
	"testing"
	"time"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// tally counts a run's outcomes.
type tally struct {
	succeeded, reproduced, refused, wrongDenials, failedNotified, failed int
	// falseFailedEvents: succeeding workflows with a WorkflowFailed Event; failedEventKept:
	// failing workflows that kept theirs.
	falseFailedEvents, failedEventKept int
	// falseHooks: succeeding workflows whose failure hook ran after their completion;
	// lateNotices: succeeding workflows with any notification pod after their completion (a
	// DAG task's own onExit notifies on success too, before the completion).
	falseHooks, lateNotices int
	// falseMetric: succeeding workflows whose workflow-level "not succeeded" counter moved
	// (with scenario.metrics).
	falseMetric int
	// staleRefusals are the refusals of the succeeding workflows' stale copies (Event
	// occurrences), and longestSpan the longest time from a workflow's first to its last.
	staleRefusals int
	longestSpan   time.Duration
}

func count(outs []outcome) tally {
	var t tally
	for _, o := range outs {
		if o.wantFail {
			t.failed++
			if o.realNotices > 0 {
				t.failedNotified++
			}
			if o.failedEvents > 0 {
				t.failedEventKept++
			}
			t.wrongDenials += o.denials
			continue
		}
		if o.failedEvents > 0 {
			t.falseFailedEvents++
		}
		if o.workflowMetric > 0 {
			t.falseMetric++
		}
		if o.lateHooks > 0 {
			t.falseHooks++
		}
		if o.notifyPods > o.realNotices {
			t.lateNotices++
		}
		t.staleRefusals += o.refusals
		t.longestSpan = max(t.longestSpan, o.refusalSpan)
		if o.phase == argo.PhaseSucceeded {
			t.succeeded++
		}
		if o.phase == argo.PhaseSucceeded && o.notifyPods > 0 {
			t.reproduced++
		}
		if o.denials > 0 {
			t.refused++
		}
	}
	return t
}

func report(t *testing.T, what string, outs []outcome) tally {
	t.Helper()
	c := count(outs)
	for _, o := range outs {
		t.Logf("  %s: phase %s, notification pods %d (hook pods %d, after its completion %d; all before its completion %d), WorkflowFailed Events %d, denial Events %d, refusals logged %d over %v, workflow metric %v (should fail: %v)",
			o.name, o.phase, o.notifyPods, o.hookPods, o.lateHooks, o.realNotices, o.failedEvents, o.denials, o.refusals, o.refusalSpan.Round(time.Millisecond), o.workflowMetric, o.wantFail)
	}
	t.Logf("RESULT %s: %d succeeding workflows (%d ended Succeeded), false notification sent %d (by a hook %d), false WorkflowFailed Event kept %d, "+
		"workflow-level user metric moved %d, stale attempts refused %d (%d refusals, the longest from first to last %v); "+
		"%d failing workflows, notified %d, WorkflowFailed Event kept %d; wrong denials %d",
		what, len(outs)-c.failed, c.succeeded, c.reproduced, c.falseHooks, c.falseFailedEvents, c.falseMetric, c.refused, c.staleRefusals,
		c.longestSpan.Round(time.Millisecond), c.failed, c.failedNotified, c.failedEventKept, c.wrongDenials)
	return c
}

func TestExposedControllerSendsTheFalseNoticeAndTheGuardRefusesIt(t *testing.T) {
	n := tries(t)
	// Without the guard, then with it but its Event rule off: nothing refuses the stale pass's
	// WorkflowFailed Event, so the refused pod alone (a 429, which Argo retries) must keep the
	// pass from a terminal phase. At the e2e's requeue (1 s), and at Argo's default (10 s).
	for _, requeue := range []string{"1s", "10s"} {
		env := []string{"DEFAULT_REQUEUE_TIME=" + requeue}
		var without tally
		name := "v3.4.17 without the guard, requeue " + requeue
		t.Run(name, func(t *testing.T) {
			without = report(t, name, runScenario(t, scenario{version: "v3.4.17", mode: noGuard, ok: n, metrics: true, env: env}))
			if requeue == "1s" && without.reproduced == 0 {
				t.Errorf("the stale exit handler was not reproduced in %d tries: the proof below proves nothing", n)
			}
		})
		name = "v3.4.17 with the guard, its Event rule off, requeue " + requeue
		t.Run(name, func(t *testing.T) {
			c := report(t, name, runScenario(t, scenario{version: "v3.4.17", mode: guardNoEventRule, ok: n, metrics: true, env: env}))
			if c.reproduced != 0 {
				t.Errorf("%d false notifications went out with the guard on", c.reproduced)
			}
			if without.reproduced > 0 && c.refused == 0 {
				t.Errorf("no stale attempt was refused in %d tries: the guard was not shown at work", n)
			}
			if c.falseFailedEvents > without.falseFailedEvents || c.falseMetric > without.falseMetric {
				t.Errorf("with the guard: %d false WorkflowFailed Events and %d user metrics moved, without it %d and %d: a refused stale pass still fails the workflow in Argo's memory",
					c.falseFailedEvents, c.falseMetric, without.falseFailedEvents, without.falseMetric)
			}
		})
	}
	// A workflow-level failure hook: the first and only pod a stale pass sends (the exit
	// handler waits for it), with no on-exit label, which the guard covers by default.
	var withoutHook tally
	name := "v3.4.17, a workflow-level failure hook, without the guard, requeue 1s"
	t.Run(name, func(t *testing.T) {
		withoutHook = report(t, name, runScenario(t, scenario{version: "v3.4.17", mode: noGuard, ok: n, failing: 1, hook: hookWorkflow, env: []string{"DEFAULT_REQUEUE_TIME=1s"}}))
		if withoutHook.falseHooks == 0 {
			t.Errorf("no false failure notice from a stale pass's hook in %d tries (%d from any pod): the proof below proves nothing", n, withoutHook.reproduced)
		}
	})
	name = "v3.4.17, a workflow-level failure hook, with the guard"
	t.Run(name, func(t *testing.T) {
		c := report(t, name, runScenario(t, scenario{version: "v3.4.17", mode: guardDirect, ok: n, failing: 1, hook: hookWorkflow, env: []string{"DEFAULT_REQUEUE_TIME=1s"}}))
		checkGuarded(t, c, n, withoutHook.falseHooks > 0)
		if c.falseHooks != 0 {
			t.Errorf("%d succeeding workflows ran their failure hook after completion with the guard on", c.falseHooks)
		}
	})
	for _, mode := range []guardMode{guardDirect, guardLagging} {
		name := map[guardMode]string{guardDirect: "v3.4.17 with the guard", guardLagging: "v3.4.17 with the guard, its watch lagging too"}[mode]
		t.Run(name, func(t *testing.T) {
			c := report(t, name, run(t, "v3.4.17", mode, n, 1))
			checkGuarded(t, c, n, true)
		})
	}
}

// checkGuarded checks a run with the guard on: no false notification and no false
// WorkflowFailed Event for any of the n succeeding workflows, a stale attempt refused (when
// shown is set: on a controller that reproduces the bug in every run), and the failing
// workflows keeping both their notification and their WorkflowFailed Event.
func checkGuarded(t *testing.T, c tally, n int, shown bool) {
	t.Helper()
	if c.reproduced != 0 {
		t.Errorf("%d false notifications went out with the guard on", c.reproduced)
	}
	if c.falseFailedEvents != 0 {
		t.Errorf("%d succeeding workflows kept a false WorkflowFailed Event with the guard on", c.falseFailedEvents)
	}
	checkSucceededAndRefused(t, c, n, shown)
	if c.wrongDenials != 0 || c.failedNotified != c.failed || c.failedEventKept != c.failed {
		t.Errorf("failing workflows: %d of %d notified, %d kept their WorkflowFailed Event, %d wrong denials", c.failedNotified, c.failed, c.failedEventKept, c.wrongDenials)
	}
}

// checkSucceededAndRefused checks that all n succeeding workflows ended Succeeded and, when
// shown is set, that a stale attempt was refused.
func checkSucceededAndRefused(t *testing.T, c tally, n int, shown bool) {
	t.Helper()
	if c.succeeded != n {
		t.Errorf("%d of %d workflows ended Succeeded", c.succeeded, n)
	}
	if shown && c.refused == 0 {
		t.Errorf("no stale attempt was refused in %d tries: the guard was not shown at work", n)
	}
}

func TestFixedControllerNeedsNoGuard(t *testing.T) {
	c := report(t, "v3.7.18 with the guard", run(t, "v3.7.18", guardDirect, tries(t), 1))
	if c.reproduced != 0 || c.refused != 0 {
		t.Errorf("v3.7.18: %d false notifications, %d refusals; want none", c.reproduced, c.refused)
	}
	if c.wrongDenials != 0 || c.failedNotified != c.failed {
		t.Errorf("failing workflows: %d of %d notified, %d wrong denials", c.failedNotified, c.failed, c.wrongDenials)
	}
}

func TestV4Controller(t *testing.T) {
	n := tries(t)
	without := report(t, "v4.0.5 without the guard", run(t, "v4.0.5", noGuard, n, 0))
	with := report(t, "v4.0.5 with the guard", run(t, "v4.0.5", guardDirect, n, 1))
	if with.reproduced != 0 {
		t.Errorf("%d false notifications went out with the guard on", with.reproduced)
	}
	if with.wrongDenials != 0 || with.failedNotified != with.failed {
		t.Errorf("failing workflows: %d of %d notified, %d wrong denials", with.failedNotified, with.failed, with.wrongDenials)
	}
	t.Logf("v4.0.5 exposed in this run: %v (%d of %d without the guard)", without.reproduced > 0, without.reproduced, n)
}

// The WorkflowFailed Event of a stale copy, and the failure metrics of its pass, on the other
// exposed controllers: v3.6.18 (3.6 never got upstream's fix; it holds the terminal phase back
// while a task result is incomplete) and v4.0.5 with INFORMER_WRITE_BACK=true (the 3.x cache
// behaviour). Each reported without the guard, with the guard but its Event rule off (the
// refused pod alone, a 429, must keep the stale pass from a terminal phase: no more false
// Events, user metrics or argo_workflows_total_count than without the guard), and with
// everything on.
func TestFailureEventsOnOtherExposedControllers(t *testing.T) {
	n := tries(t)
	for _, c := range []struct {
		version, name string
		env           []string
	}{{"v3.6.18", "v3.6.18", nil}, {"v4.0.5", "v4.0.5 INFORMER_WRITE_BACK=true", []string{"INFORMER_WRITE_BACK=true"}}} {
		t.Run(c.name, func(t *testing.T) {
			var without tally
			var withoutTotal float64
			for _, mode := range []guardMode{noGuard, guardNoEventRule} {
				what := c.name + map[guardMode]string{noGuard: " without the guard", guardNoEventRule: " with the guard, its Event rule off"}[mode]
				tot := &totals{}
				outs := runScenario(t, scenario{version: c.version, mode: mode, ok: n, failing: 1, env: c.env, metrics: true, totals: tot})
				got := report(t, what, outs)
				// The failing workflow counts in argo_workflows_total_count once for each pass
				// that marked it failed, its stale copies' among them, as its own counter does:
				// what is left is the count of the succeeding workflows' stale passes.
				var failing float64
				for _, o := range outs {
					if o.wantFail && o.workflowMetric == 0 {
						t.Errorf("the failing workflow's own counter did not move: the controller's metrics were not read, and the figures of the others say nothing")
					}
					if o.wantFail {
						failing += o.workflowMetric
					}
				}
				total := tot.failedOrErrorAdded() - failing
				if tot.after.failedOrError == nil {
					total = 0 // 3.4: no such series
				}
				t.Logf("RESULT %s: argo_workflows_total_count{phase=~\"Failed|Error\"} moved by the succeeding workflows' stale passes: %v (the failing workflow's passes: %v; before the first workflow: %v; at the end: %v)",
					what, total, failing, tot.before, tot.after)
				if mode == noGuard {
					without, withoutTotal = got, total
					continue
				}
				if got.reproduced != 0 {
					t.Errorf("%d false notifications went out with the guard on", got.reproduced)
				}
				if got.falseFailedEvents > without.falseFailedEvents || got.falseMetric > without.falseMetric || total > withoutTotal {
					t.Errorf("with the guard: %d false WorkflowFailed Events, %d user metrics moved, argo_workflows_total_count +%v; without it %d, %d, +%v",
						got.falseFailedEvents, got.falseMetric, total, without.falseFailedEvents, without.falseMetric, withoutTotal)
				}
			}
			with := report(t, c.name+" with the guard", runScenario(t, scenario{version: c.version, mode: guardDirect, ok: n, failing: 1, env: c.env}))
			checkGuarded(t, with, n, false)
			t.Logf("%s: stale attempts refused for %d of %d workflows", c.name, with.refused, n)
		})
	}
}
