package argo

import "testing"

// The agent pod is named <wf>-1340600742-agent: Argo names it by the node ID of "agent".
func TestNodeIDMatchesTheAgentPodName(t *testing.T) {
	if got, want := NodeID("wf", "agent"), "wf-1340600742"; got != want {
		t.Errorf("NodeID(wf, agent) = %s, want %s", got, want)
	}
}
