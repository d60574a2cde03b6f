package argo

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The agent pod is named <wf>-1340600742-agent: Argo names it by the node ID of "agent".
func TestNodeIDMatchesTheAgentPodName(t *testing.T) {
	if got, want := NodeID("wf", "agent"), "wf-1340600742"; got != want {
		t.Errorf("NodeID(wf, agent) = %s, want %s", got, want)
	}
}

func TestPhaseFromLabels(t *testing.T) {
	for _, tc := range []struct {
		name, phase, completed string
		want                   Phase
	}{
		{"completed and succeeded", "Succeeded", "true", PhaseSucceeded},
		{"completed and failed", "Failed", "true", PhaseFailed},
		{"completed and error", "Error", "true", PhaseError},
		{"running", "Running", "false", PhaseRunning},
		{"pending, completed label absent", "Pending", "", PhasePending},
		{"not reconciled yet: no phase label", "", "false", PhaseUnsettled},
		{"retried by v4: stale phase label, completed removed", "Failed", "", PhaseUnsettled},
		{"daemon steps on 3.4: terminal phase before the completed label", "Succeeded", "false", PhaseUnsettled},
		{"completed but not a terminal phase label", "Running", "true", PhaseUnsettled},
		{"a phase label Argo never writes", "succeeded", "true", PhaseUnsettled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			labels := map[string]string{}
			if tc.phase != "" {
				labels[LabelPhase] = tc.phase
			}
			if tc.completed != "" {
				labels[LabelCompleted] = tc.completed
			}
			if got := PhaseFromLabels(labels); got != tc.want {
				t.Errorf("PhaseFromLabels(%v) = %q, want %q", labels, got, tc.want)
			}
		})
	}
}

// NodesOf reads each node's type and phase from a workflow read whole; Pending is a node not
// yet run to its end.
func TestNodesOf(t *testing.T) {
	wf := &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{"nodes": map[string]any{
		"wf-1": map[string]any{"type": "HTTP", "phase": "Pending"},
		"wf-2": map[string]any{"type": "Plugin", "phase": "Running"},
		"wf-3": map[string]any{"type": "HTTP"},
		"wf-4": map[string]any{"type": "HTTP", "phase": "Succeeded"},
		"wf-5": map[string]any{"type": "Pod", "phase": "Failed"},
		"wf-6": "not a node",
	}}}}
	nodes := NodesOf(wf)
	for id, want := range map[string]struct {
		typ     string
		pending bool
	}{"wf-1": {"HTTP", true}, "wf-2": {"Plugin", true}, "wf-3": {"HTTP", true}, "wf-4": {"HTTP", false}, "wf-5": {"Pod", false}, "wf-6": {"", true}} {
		n, ok := nodes[id]
		if !ok || n.Type != want.typ || n.Pending() != want.pending {
			t.Errorf("node %s = %+v (found %v), want type %q pending %v", id, n, ok, want.typ, want.pending)
		}
	}
	if got := NodesOf(&unstructured.Unstructured{Object: map[string]any{}}); got != nil {
		t.Errorf("no status: %v, want nil", got)
	}
}
