//go:build envtest

package faults

import (
	"context"
	"testing"
	"time"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// propagation is how long the stand-in Service takes to follow a replica's readiness: the
// endpoints controller and kube-proxy take a second or more in a real cluster.
const propagation = time.Second

// TestRollingRestartUnderLoadLosesNoAdmission restarts both replicas one after the other as a
// Deployment does (a new one ready first, then the old one told to stop) while admissions
// flow, and counts every one: none may fail or be decided wrong.
func TestRollingRestartUnderLoadLosesNoAdmission(t *testing.T) {
	b := newService(t)

	// The drain must outlast the propagation.
	args := []string{"--shutdown-delay=" + (3 * propagation).String()}
	a := startReplica(t, b, "a", args...)
	bb := startReplica(t, b, "b", args...)

	ns := newNamespace(t)
	running := createWorkflow(t, ns, "running", argo.PhaseRunning)
	succeeded := createWorkflow(t, ns, "succeeded", argo.PhaseSucceeded)
	loadCtx, stopLoad := context.WithCancel(t.Context())
	c, wait := load(loadCtx, running, succeeded, 8, 80)
	c.sentAtLeast(t, 40)
	for _, old := range []*replica{a, bb} {
		startReplica(t, b, old.name+"2", args...)
		old.stop(t)
	}
	c.sentAtLeast(t, 40) // on the new replicas alone
	stopLoad()
	wait()
	t.Logf("rolling restart of 2 replicas under load: %s; connections refused at the Service: %d", c, b.refused.Load())
	if c.failed.Load() != 0 || c.wrong.Load() != 0 {
		t.Errorf("admissions lost or decided wrong during the rollout: %s; first failures: %q", c, c.failures)
	}
}
