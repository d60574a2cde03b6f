//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// TestAFixedControllerBesideASecondController runs what can still bring a controller with
// upstream's fix an older copy of a completed workflow: a second controller running beside it,
// as LEADER_ELECTION_DISABLE=true with a RollingUpdate does (argo-workflows #16034). Upstream's
// fix remembers the versions a controller wrote itself; the second one's memory holds none of
// the first one's writes, and its watch lags as the first one's does. Three reference workflows
// run on the first controller; the second starts while their first pods run. Without the guard,
// it must create pods after their workflow completed (else the run reproduced nothing); with
// the guard, none, every workflow Succeeded, and the guard logged refusals.
func TestAFixedControllerBesideASecondController(t *testing.T) {
	for _, version := range fixedLines {
		t.Run(version, func(t *testing.T) {
			without := runBeside(t, version, noGuard)
			t.Logf("BESIDE %s, no guard: %s", version, without.describe())
			if without.latePods() == 0 {
				t.Errorf("%s, no guard: the second controller created no pod after its workflow completed, so this run reproduced no stale pass "+
					"and says nothing of the guard (writes after completion: %s)", version, without.census.String())
			}
			with := runBeside(t, version, guardDirect)
			t.Logf("BESIDE %s, guard: %s", version, with.describe())
			if n := with.latePods(); n != 0 {
				t.Errorf("%s, guard: %d pods created after their workflow completed: %q", version, n, with.census.pods)
			}
			for _, o := range with.outs {
				if o.phase != argo.PhaseSucceeded {
					t.Errorf("%s, guard: %s ended %s, want Succeeded", version, o.name, o.phase)
				}
			}
			if with.refusals() == 0 && without.latePods() > 0 {
				t.Errorf("%s, guard: no refusal logged although the run without the guard created %d late pods", version, without.latePods())
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
	var logBefore int64
	var logFile string
	sc := scenario{version: version, mode: mode, census: &h.census}
	sc.drive = func(ctx context.Context, t *testing.T, r rig) []*unstructured.Unstructured {
		var wfs []*unstructured.Unstructured
		for range 3 {
			wf := referenceWorkflow(false)
			if err := r.c.Create(ctx, wf); err != nil {
				t.Fatal(err)
			}
			wfs = append(wfs, wf)
		}
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			for _, wf := range wfs {
				if !runsAPod(ctx, r.c, wf) {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("the workflows did not all run a pod within 2 minutes: %v", err)
		}
		createStandbyConfig(ctx, t, r.c)
		logFile, logBefore = r.controllerLog, fileSize(r.controllerLog)
		r.launch([]string{"--configmap=" + standbyConfig}, nil)
		return wfs
	}
	sc.afterRun = func(context.Context, rig, []*unstructured.Unstructured) {
		logs, _ := os.ReadFile(logFile)
		if int64(len(logs)) > logBefore {
			h.rejected = strings.Count(string(logs[logBefore:]), "Rejecting stale copy")
		}
	}
	h.outs = runScenario(t, sc)
	return h
}
