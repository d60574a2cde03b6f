//go:build e2e

package e2e

import (
	"cmp"
	"os"
	"slices"
	"strings"
	"testing"
)

// hookLines are the exposed controller lines the hook proof runs on: the unfixed 3.4, 3.5, 3.6
// and 3.7 releases, and 4.0 with the informer write-back that exposes it.
var hookLines = []struct {
	version string
	env     []string
}{
	{"v3.4.17", nil},
	{"v3.5.14", nil},
	{"v3.6.18", nil},
	{"v3.7.15", nil},
	{"v4.0.5", []string{"INFORMER_WRITE_BACK=true"}},
}

// TestFailureHooksOnExposedControllers runs the reference workflows with a failure hook of
// each shape users write (workflow-level; on a step; on a DAG task, beside that task's own
// onExit) on each exposed line, without the guard and with its defaults. A notification pod
// (hook or onExit) of a succeeding workflow created after its completion is a stale pass's:
// counted without the guard; with it none may land, the failing workflow must still be
// notified, and no pod of it may be refused. E2E_LINES (space-separated versions) narrows the
// lines, E2E_HOOKS (shape names, comma-separated) the shapes.
func TestFailureHooksOnExposedControllers(t *testing.T) {
	n := tries(t)
	lines := strings.Fields(cmp.Or(os.Getenv("E2E_LINES"), "v3.4.17 v3.5.14 v3.6.18 v3.7.15 v4.0.5"))
	shapes := strings.Split(cmp.Or(os.Getenv("E2E_HOOKS"), strings.Join([]string{hookWorkflow, hookStep, hookDAG}, ",")), ",")
	for _, line := range hookLines {
		if !slices.Contains(lines, line.version) {
			continue
		}
		for _, shape := range shapes {
			name := strings.Join(append([]string{line.version}, line.env...), " ") + ", a " + shape + " hook"
			env := append([]string{"DEFAULT_REQUEUE_TIME=1s"}, line.env...)
			var without tally
			t.Run(name+", without the guard", func(t *testing.T) {
				without = report(t, name+" without the guard", runScenario(t, scenario{version: line.version, mode: noGuard, ok: n, failing: 1, hook: shape, env: env}))
				if without.failedNotified != without.failed {
					t.Errorf("the failing workflow sent no notice without the guard: the hook does not fire as written")
				}
			})
			t.Run(name+", with the guard", func(t *testing.T) {
				c := report(t, name+" with the guard", runScenario(t, scenario{version: line.version, mode: guardDirect, ok: n, failing: 1, hook: shape, env: env}))
				if c.lateNotices != 0 || c.falseHooks != 0 {
					t.Errorf("with the guard: %d succeeding workflows notified after their completion, %d of them by a hook", c.lateNotices, c.falseHooks)
				}
				if c.wrongDenials != 0 || c.failedNotified != c.failed {
					t.Errorf("failing workflows: %d of %d notified, %d wrong denials", c.failedNotified, c.failed, c.wrongDenials)
				}
				if without.lateNotices > 0 && c.refused == 0 {
					t.Errorf("no stale attempt was refused in %d tries: the guard was not shown at work", n)
				}
				t.Logf("RESULT %s: succeeding workflows notified after their completion: without the guard %d (%d by a hook), with it %d (%d by a hook); %d stale attempts refused; failing workflows notified %d of %d, wrong denials %d",
					name, without.lateNotices, without.falseHooks, c.lateNotices, c.falseHooks, c.refused, c.failedNotified, c.failed, c.wrongDenials)
			})
		}
	}
}
