package testenv

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// CreateWorkflow creates fixture.Workflow(namespace, name) through c (a name ending in "-" is
// generated) and, when phase is set, writes its phase as Argo's controller does: one Update of
// the whole object (SetPhase).
func CreateWorkflow(t testing.TB, c client.Client, namespace, name string, phase argo.Phase) *unstructured.Unstructured {
	t.Helper()
	wf := fixture.Workflow(namespace, name)
	if err := c.Create(t.Context(), wf); err != nil {
		t.Fatalf("creating workflow %s: %v", name, err)
	}
	if phase != "" {
		SetPhase(t, c, wf, phase)
	}
	return wf
}

// SetPhase writes wf's phase with one whole-object Update, as Argo's controller does
// (fixture.MarkPhase; PhaseUnknown as v4.0+'s argo retry leaves it).
func SetPhase(t testing.TB, c client.Client, wf *unstructured.Unstructured, phase argo.Phase) {
	t.Helper()
	fixture.MarkPhase(wf, phase)
	if err := c.Update(t.Context(), wf); err != nil {
		t.Fatalf("writing phase %q of %s: %v", phase, wf.GetName(), err)
	}
}
