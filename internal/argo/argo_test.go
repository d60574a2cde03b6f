package argo

import "testing"

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
