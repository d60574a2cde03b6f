package argo

import (
	"encoding/json"
	"testing"
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

// A workflow read whole decodes into WorkflowNodes: each node's name, type and phase by ID;
// Pending is a node not yet run to its end.
func TestWorkflowNodesDecode(t *testing.T) {
	raw := []byte(`{"metadata":{"name":"wf","uid":"u1"},"spec":{"templates":[{"name":"big"}]},"status":{"phase":"Running","nodes":{
		"wf-1":{"type":"HTTP","phase":"Pending","name":"wf[0].call","outputs":{"result":"x"}},
		"wf-2":{"type":"Plugin","phase":"Running"},
		"wf-3":{"type":"HTTP"},
		"wf-4":{"type":"HTTP","phase":"Succeeded"},
		"wf-5":{"type":"Pod","phase":"Failed"}}}}`)
	var wf WorkflowNodes
	if err := json.Unmarshal(raw, &wf); err != nil {
		t.Fatal(err)
	}
	if wf.UID != "u1" || wf.Status.Phase != PhaseRunning || wf.Status.Nodes["wf-1"].Name != "wf[0].call" {
		t.Errorf("decoded %+v", wf)
	}
	for id, want := range map[string]struct {
		typ     string
		pending bool
	}{"wf-1": {"HTTP", true}, "wf-2": {"Plugin", true}, "wf-3": {"HTTP", true}, "wf-4": {"HTTP", false}, "wf-5": {"Pod", false}} {
		n, ok := wf.Status.Nodes[id]
		if !ok || n.Type != want.typ || n.Pending() != want.pending {
			t.Errorf("node %s = %+v (found %v), want type %q pending %v", id, n, ok, want.typ, want.pending)
		}
	}
	var none WorkflowNodes
	if err := json.Unmarshal([]byte(`{"metadata":{"name":"wf"}}`), &none); err != nil || none.Status.Nodes != nil {
		t.Errorf("no status: %v, %v; want no nodes", none.Status.Nodes, err)
	}
}

func TestGroupOf(t *testing.T) {
	for apiVersion, want := range map[string]string{
		"argoproj.io/v1alpha1": "argoproj.io",
		"argoproj.io/":         "argoproj.io",
		"v1":                   "",
		"":                     "",
		"argoproj.io":          "",
	} {
		if got := GroupOf(apiVersion); got != want {
			t.Errorf("GroupOf(%q) = %q, want %q", apiVersion, got, want)
		}
	}
}

// TestNodeInExitHandlerOrHook: a status node's name tells an exit handler's or a hook's node by
// its segments after the workflow's name, never by a piece of a step's name or of the
// workflow's; where names are alike (a step named onExit, a DAG task named hooks), it says yes.
func TestNodeInExitHandlerOrHook(t *testing.T) {
	for _, tc := range []struct {
		workflow, node string
		want           bool
	}{
		{"wf", "wf.onExit", true},
		{"wf", "wf.onExit[0].notify", true},
		{"wf", "wf.onExit(1)", true},
		{"wf", "wf[0].step.onExit", true},
		{"wf", "wf.task.onExit.notify", true},
		{"wf", "wf.hooks.running", true},
		{"wf", "wf[0].step.hooks.failed[0].notify", true},
		{"wf", "wf.onExitCleanup", false},
		{"wf", "wf[0].onExit-notify(0:a)", false},
		{"wf", "wf[0].main", false},
		{"etl.hooks.daily", "etl.hooks.daily[0].load", false},
		{"etl.hooks.daily", "etl.hooks.daily.hooks.running", true},
		{"a.onExit.b", "a.onExit.b.task", false},
		{"wf", "wf[0].onExit", true}, // a step named onExit: taken for one
		{"wf", "other.onExit", true}, // not under the workflow's name: read whole
	} {
		if got := (Node{Name: tc.node}).InExitHandlerOrHook(tc.workflow); got != tc.want {
			t.Errorf("%q of workflow %q: InExitHandlerOrHook = %v, want %v", tc.node, tc.workflow, got, tc.want)
		}
	}
}
