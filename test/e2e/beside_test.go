//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// TestAFixedControllerBesideASecondController runs what can still bring a controller with
// upstream's fix an older copy of a completed workflow: a second controller running beside it,
// as LEADER_ELECTION_DISABLE=true with a RollingUpdate does (argo-workflows #16034). Upstream's
// fix remembers the versions a controller wrote itself; the second one's memory holds none of
// the first one's writes, and its watch lags as the first one's does. Three reference workflows
// run on the first controller; the second starts while their first pods run, as a user of its
// own (testenv.SecondControllerUser) behind a lagging proxy of its own, so that the audit log
// tells whose each write is. Without the guard, the two must create pods after their workflow
// completed (else the run reproduced nothing), by either controller (either copy can be the
// stale one: the one that did not write a workflow's completion); with the guard, no pod after completion from either, every workflow Succeeded
// with no WorkflowFailed Event, and creates after completion refused.
func TestAFixedControllerBesideASecondController(t *testing.T) {
	for _, version := range fixedLines {
		t.Run(version, func(t *testing.T) {
			without := runBeside(t, version, noGuard)
			t.Logf("BESIDE %s, no guard: %s", version, without.describe())
			// Either controller may be the one whose copy is stale: the one that did not write a
			// workflow's completion (one controller alone sends none: TestFixedControllerNeedsNoGuard).
			late := without.latePods()
			if late == 0 {
				t.Errorf("%s, no guard: neither controller created a pod after its workflow completed, so this run reproduced no stale pass "+
					"and says nothing of the guard (writes after completion: %s)", version, without.census.String())
			}
			t.Logf("%s, no guard: pods after completion by the first controller %q, by the second %q", version,
				without.census.podsBy[testenv.ControllerUser], without.census.podsBy[testenv.SecondControllerUser])
			with := runBeside(t, version, guardDirect)
			t.Logf("BESIDE %s, guard: %s", version, with.describe())
			if n := with.latePods(); n != 0 {
				t.Errorf("%s, guard: %d pods created after their workflow completed: %q", version, n, with.census.pods)
			}
			for _, o := range without.outs {
				t.Logf("%s, no guard: %s ended %s, %d WorkflowFailed Events kept", version, o.name, o.phase, o.failedEvents)
			}
			for _, o := range with.outs {
				if o.phase != argo.PhaseSucceeded {
					t.Errorf("%s, guard: %s ended %s, want Succeeded", version, o.name, o.phase)
				}
				if o.failedEvents != 0 {
					t.Errorf("%s, guard: %d WorkflowFailed Events about %s, which Succeeded", version, o.failedEvents, o.name)
				}
			}
			if with.census.rows["create pods 429"]+with.census.rows[secondRow+"create pods 429"] == 0 && late > 0 {
				t.Errorf("%s, guard: no create refused after completion although without the guard the controllers created %d late pods (writes after completion: %s)",
					version, late, with.census.String())
			}
		})
	}
}

// runBeside runs three reference workflows on a fixed controller of version behind the lagging
// watch, the guard as mode says, and starts a second controller like it (leader election off,
// its metrics server off) once every workflow runs a pod.
func runBeside(t *testing.T, version string, mode guardMode) *handover {
	t.Helper()
	h := &handover{}
	var second *testenv.Process
	sc := scenario{version: version, mode: mode, census: &h.census}
	sc.drive = func(ctx context.Context, t *testing.T, r rig) []*unstructured.Unstructured {
		wfs := startThreeRunning(ctx, t, r)
		createStandbyConfig(ctx, t, r.c)
		second = r.launchSecond([]string{"--configmap=" + standbyConfig}, nil)
		return wfs
	}
	sc.afterRun = func(_ context.Context, r rig, _ []*unstructured.Unstructured) {
		if err := second.Exited(); err != nil {
			t.Errorf("the second controller did not run to the end: %v\n%s", err, tail([]byte(readFile(r.secondLog)), 30))
		}
		for _, f := range []string{r.controllerLog, r.secondLog} {
			h.rejected += strings.Count(readFile(f), "Rejecting stale copy")
		}
	}
	h.outs = runScenario(t, sc)
	return h
}
