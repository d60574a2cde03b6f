//go:build e2e

package ops

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// guard runs a guard on envtest's webhook address (one at a time: the previous one is stopped
// first), its metrics behind st's service.
func (st *stack) guard(t *testing.T, args ...string) *testenv.Guard {
	t.Helper()
	return st.guardVia(t, env.KubeConfig(), args...)
}

// guardVia is guard, the guard reaching the API server with kubeconfig (a fault proxy's). A
// flag in args overrides the same flag set here.
func (st *stack) guardVia(t *testing.T, kubeconfig []byte, args ...string) *testenv.Guard {
	t.Helper()
	st.stopGuard(t)
	out := &testenv.Output{}
	g, err := testenv.StartGuard(t.Context(), guardBin, kubeconfig, append([]string{
		"--webhook-port=" + strconv.Itoa(env.WebhookPort), "--webhook-cert-path=" + env.WebhookCertDir,
		"--shutdown-delay=0s", "--expected-requester=" + adminUser}, args...), out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the guard said:\n%s", out)
		}
	})
	st.current = g
	st.svc.route(g.MetricsAddr)
	return g
}

// stopGuard stops the running guard, if any: the service has no endpoint left, and nothing
// answers the webhook.
func (st *stack) stopGuard(t *testing.T) {
	t.Helper()
	st.svc.route("")
	if st.current == nil {
		return
	}
	if err := st.current.Stop(); err != nil {
		t.Logf("stopping the guard: %v", err)
	}
	st.current = nil
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(env.WebhookHost, strconv.Itoa(env.WebhookPort)), time.Second)
		if err != nil {
			return true, nil
		}
		_ = c.Close()
		return false, nil
	})
	if err != nil {
		t.Fatalf("the webhook port still answers after the guard stopped: %v", err)
	}
}

func newNamespace(t *testing.T) string {
	return testenv.Namespace(t, env.Client, "ops-", nil)
}

// timing is one row of docs/evidence/alerts.md's table: from the cause to the delivered notification,
// and from the end of the cause to the delivered resolution.
type timing struct {
	alert           string
	fired, resolved time.Duration
}

// logTimings logs the rows of docs/evidence/alerts.md's table that *timings holds when it is called.
func logTimings(t *testing.T, timings *[]timing) {
	t.Helper()
	var b strings.Builder
	for _, tm := range *timings {
		fmt.Fprintf(&b, "\n| `%s` | %s | %s |", tm.alert, tm.fired.Round(100*time.Millisecond), tm.resolved.Round(100*time.Millisecond))
	}
	t.Logf("cause to notification, end of cause to resolution:%s", b.String())
}

// TestAlertsOnTheRealTools: with the chart's rules (short waits) in a real Prometheus and a
// real Alertmanager, a healthy guard raises nothing (the negative control); then each cause in
// turn brings about its alert, delivered to the receiver with its annotations rendered, and
// resolved once the cause has passed.
func TestAlertsOnTheRealTools(t *testing.T) {
	st := startStack(t)
	st.guard(t)
	ns := newNamespace(t)
	var timings []timing
	defer logTimings(t, &timings)

	t.Run("negative control: a healthy guard at work raises nothing", func(t *testing.T) {
		start := time.Now()
		// The API server's series are scraped (else ExitGuardAPIServerMetricsMissing), and the
		// guard's.
		waitQuery(t, st, `up{job="apiserver"} == 1`)
		waitQuery(t, st, `exit_guard_ready{namespace="argo"} == 1`)
		for i := range 10 {
			running := testenv.CreateWorkflow(t, env.Client, ns, "running-"+strconv.Itoa(i), argo.PhaseRunning)
			if err := env.Client.Create(t.Context(), fixture.ExitPod(running)); err != nil {
				t.Fatalf("the exit handler of a running workflow: %v", err)
			}
		}
		// Watched for longer than every short wait and window together: any alert firing or
		// delivered fails at once. (Pending is not: before the first scrapes, the first
		// evaluations see no series, and ExitGuardNoReadyReplica and
		// ExitGuardAPIServerMetricsMissing are pending for a second or two.)
		var raised string
		err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, 35*time.Second, true, func(ctx context.Context) (bool, error) {
			if got := st.recv.Notifications(); len(got) != 0 {
				raised = fmt.Sprintf("%d notifications delivered: %v", len(got), got)
				return true, nil
			}
			if alerts, err := testenv.Query(ctx, st.prom.Addr, `ALERTS{alertstate="firing"}`); err == nil && len(alerts) != 0 {
				raised = fmt.Sprintf("alerts firing: %v", alerts)
				return true, nil
			}
			return false, nil
		})
		if raised != "" {
			t.Errorf("a healthy guard raised something since %s: %s", start.Format(time.TimeOnly), raised)
		} else if !wait.Interrupted(err) {
			t.Fatal(err)
		}
	})

	t.Run("ExitGuardStaleCopyRefused: a stale exit handler refused", func(t *testing.T) {
		done := testenv.CreateWorkflow(t, env.Client, ns, "done", argo.PhaseSucceeded)
		cause := time.Now()
		if err := env.Client.Create(t.Context(), fixture.ExitPod(done)); !contract.IsRefusal(err) {
			t.Fatalf("the stale exit handler: %v, want refused", err)
		}
		n, fired := st.waitNotified(t, "ExitGuardStaleCopyRefused", "firing", cause, 90*time.Second,
			map[string]string{"kind": "Pod", "reason": "workflow-completed", "verdict": "denied", "severity": "info"})
		if want := "exit-guard found 1 stale exit handler(s) (Pod, workflow-completed; verdict denied)."; n.Annotations["summary"] != want {
			t.Errorf("summary %q, want %q", n.Annotations["summary"], want)
		}
		_, resolved := st.waitNotified(t, "ExitGuardStaleCopyRefused", "resolved", cause, 120*time.Second, nil)
		timings = append(timings, timing{alert: "ExitGuardStaleCopyRefused", fired: fired, resolved: resolved})
	})

	t.Run("ExitGuardRefusalsForUnexpectedRequester: another user's stale exit handler", func(t *testing.T) {
		other := env.ClientAs(t, "someone-else", "system:masters")
		done := testenv.CreateWorkflow(t, env.Client, ns, "done-other", argo.PhaseSucceeded)
		cause := time.Now()
		if err := other.Create(t.Context(), fixture.ExitPod(done)); !contract.IsRefusal(err) {
			t.Fatalf("the stale exit handler sent by another user: %v, want refused", err)
		}
		n, fired := st.waitNotified(t, "ExitGuardRefusalsForUnexpectedRequester", "firing", cause, 90*time.Second,
			map[string]string{"kind": "Pod", "reason": "workflow-completed", "severity": "warning"})
		if !strings.Contains(n.Annotations["summary"], "refused 1 Pod request(s) sent for a user other than Argo's workflow controller") {
			t.Errorf("summary %q", n.Annotations["summary"])
		}
		if _, ok := st.recv.First("ExitGuardStaleCopyRefused", "firing", cause); ok {
			t.Error("another user's refusal raised ExitGuardStaleCopyRefused, meant for stale exit handlers of Argo's controller")
		}
		_, resolved := st.waitNotified(t, "ExitGuardRefusalsForUnexpectedRequester", "resolved", cause, 120*time.Second, nil)
		timings = append(timings, timing{alert: "ExitGuardRefusalsForUnexpectedRequester", fired: fired, resolved: resolved})
	})

	t.Run("ExitGuardNoReadyReplica and ExitGuardWebhookFailingOpen: the guard stopped while exit handlers are created", func(t *testing.T) {
		st.stopGuard(t)
		cause := time.Now()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			for i := 0; ctx.Err() == nil; i++ {
				running := testenv.CreateWorkflow(t, env.Client, ns, fmt.Sprintf("open-%d", i), argo.PhaseRunning)
				// Admitted unchecked: nothing answers the webhook, and it fails open.
				_ = env.Client.Create(ctx, fixture.ExitPod(running))
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}()
		_, notReady := st.waitNotified(t, "ExitGuardNoReadyReplica", "firing", cause, 90*time.Second, map[string]string{"severity": "critical"})
		n, failingOpen := st.waitNotified(t, "ExitGuardWebhookFailingOpen", "firing", cause, 120*time.Second, map[string]string{"name": "validate.exit-guard.io"})
		if !strings.Contains(n.Annotations["summary"], "failing open on the exit-guard webhook validate.exit-guard.io") {
			t.Errorf("summary %q", n.Annotations["summary"])
		}
		cancel()
		back := time.Now()
		st.guard(t)
		_, readyAgain := st.waitNotified(t, "ExitGuardNoReadyReplica", "resolved", back, 90*time.Second, nil)
		_, closed := st.waitNotified(t, "ExitGuardWebhookFailingOpen", "resolved", back, 120*time.Second, nil)
		timings = append(timings, timing{alert: "ExitGuardNoReadyReplica", fired: notReady, resolved: readyAgain},
			timing{alert: "ExitGuardWebhookFailingOpen", fired: failingOpen, resolved: closed})
	})
}

// waitQuery waits until query returns a series.
func waitQuery(t *testing.T, st *stack, query string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := testenv.Query(ctx, st.prom.Addr, query)
		return err == nil && len(got) > 0, nil
	})
	if err != nil {
		t.Fatalf("%s returned nothing within a minute: %v", query, err)
	}
}
