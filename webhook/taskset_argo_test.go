//go:build envtest

package webhook

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// runningTaskSet creates a running workflow and its TaskSet with one HTTP step, and lets the
// agent report it done, as Argo does while a workflow runs.
func runningTaskSet(t *testing.T, ns, name string) (*unstructured.Unstructured, *unstructured.Unstructured, string) {
	t.Helper()
	wf := createWorkflow(t, ns, name, argo.PhaseRunning)
	step := argo.NodeID(name, name+"[0].call")
	ts := fixture.TaskSet(wf, map[string]any{step: fixture.HTTPTask("call")})
	if err := env.Client.Create(t.Context(), ts); err != nil {
		t.Fatalf("creating the TaskSet of a running workflow: %v", err)
	}
	agentReports(t, ts, step)
	return wf, ts, step
}

// agentReports writes a task's result through the status subresource, as the agent does.
func agentReports(t *testing.T, ts *unstructured.Unstructured, node string) {
	t.Helper()
	if err := env.Client.Status().Patch(t.Context(), ts, fixture.TaskSetResult(node)); err != nil {
		t.Fatalf("the agent's status write: %v", err)
	}
}

// complete marks wf Succeeded and cleans its TaskSet up, as the controller does.
func complete(t *testing.T, wf, ts *unstructured.Unstructured, done ...string) {
	t.Helper()
	setPhase(t, wf, argo.PhaseSucceeded)
	removed := map[string]any{}
	for _, k := range done {
		removed[k] = nil
	}
	if err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(true, removed)); err != nil {
		t.Fatalf("cleanup of the TaskSet of a succeeded workflow: %v, want it admitted", err)
	}
}

// reuseName has a running workflow named name write its TaskSet, complete and be deleted, and a
// new workflow (wf) take the name, while the old TaskSet (ts) waits for the garbage collector,
// which does not run here.
func reuseName(t *testing.T, ns, name string) (old, ts, wf *unstructured.Unstructured) {
	t.Helper()
	old, ts, step := runningTaskSet(t, ns, name)
	complete(t, old, ts, step)
	if err := env.Client.Delete(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	return old, ts, createWorkflow(t, ns, name, argo.PhaseRunning)
}
