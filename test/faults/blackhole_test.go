//go:build envtest

package faults

import (
	"net/url"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// TestBlackholedConnectionsThroughTheBinary: the guard binary, authenticated as the chart's
// ServiceAccount, reaches the API server over TLS and HTTP/2 through a TCP relay. Once its
// connections carry decisions, the relay blackholes every one of them (what is sent is
// dropped, nothing is closed: a killed API-server instance, a load balancer or a conntrack
// drop). The exit handlers that follow must still be decided from live reads: the read
// path's pooled connection is pinged after 2 s of silence and closed after a 1 s unanswered
// ping, and each hedge dials a connection of its own, which the relay carries; the watch's and
// the manager's connection wait for client-go's health check (about 45 s). With both taken
// away (no bounded ping, hedges on the pool) this run was seen to decide 0 of 12 live and
// admit 4 stale exit handlers; TestHedgeGetsPastABlackholedConnection (package webhook)
// isolates the hedge.
func TestBlackholedConnectionsThroughTheBinary(t *testing.T) {
	createChartIdentity(t)
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	relay := testenv.StartRelay(t, u.Host)
	cfg := tokenConfig(t, env, overloadNamespace, "exit-guard")
	cfg.Host = "https://" + relay.Addr()
	b := newService(t)
	r := startReplicaWith(t, b, "a", kubeconfigOf(t, cfg), "--lock-check-interval=0s")

	ns := newNamespace(t)
	running := createWorkflow(t, ns, "running", argo.PhaseRunning)
	succeeded := createWorkflow(t, ns, "succeeded", argo.PhaseSucceeded)
	waitFor(t, "the guard's store to hold the completion", func() bool {
		return r.metric(t, `exit_guard_store_records{state="terminal"}`) >= 1
	})
	want := map[*unstructured.Unstructured]bool{running: false, succeeded: true}
	warm := &tally{}
	for range 2 {
		decideAll(t, warm, want)
	}
	failures := func() float64 {
		return max(0, r.metric(t, `exit_guard_live_read_failures_total{kind="timeout"}`)) + max(0, r.metric(t, `exit_guard_live_read_failures_total{kind="error"}`))
	}
	failedBefore, dialledBefore := failures(), relay.Accepted()

	relay.Blackhole()
	c := &tally{}
	start := time.Now()
	for range 6 {
		decideAll(t, c, want)
	}
	took := time.Since(start)
	fellBack := failures() - failedBefore
	t.Logf("RESULT blackholed connections: %s; %d of %d decisions from a live read; %d connections dialled after the blackhole; %s per decision",
		c, c.sent.Load()-int64(fellBack), c.sent.Load(), relay.Accepted()-dialledBefore, took/time.Duration(c.sent.Load()))
	if warm.wrong.Load()+warm.failed.Load() > 0 {
		t.Fatalf("before the blackhole: %s", warm)
	}
	if relay.Accepted() == dialledBefore {
		t.Error("no connection was dialled after the blackhole: the hedges did not open their own")
	}
	if fellBack > 0 {
		t.Errorf("%v decisions after the blackhole fell back to the store, want every one from a live read", fellBack)
	}
}

// createChartIdentity creates, in the package's API server, the chart's ServiceAccount and
// RBAC (rendered by helm) in its release namespace, once.
func createChartIdentity(t *testing.T) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: overloadNamespace}}
	if err := env.Client.Create(t.Context(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, o := range chartObjects(t) {
		if o.GetKind() == "FlowSchema" {
			continue
		}
		if err := env.Client.Create(t.Context(), o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating the chart's %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}
