//go:build e2e

package ops

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// createExitHandlers creates, once a second until the returned stop is called, a running
// workflow and its exit-handler pod (the pod's create may fail: that is what is measured).
func createExitHandlers(t *testing.T, ns, prefix string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			running := testenv.CreateWorkflow(t, env.Client, ns, fmt.Sprintf("%s-%d", prefix, i), argo.PhaseRunning)
			_ = env.Client.Create(ctx, fixture.ExitPod(running))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return func() { cancel(); <-done }
}

// waitOnLock creates a Succeeded workflow and a Pending one waiting on lock, which the first
// holds (as Argo's controller writes it), and returns the waiter and when it began to wait.
func waitOnLock(t *testing.T, ns, lock string) (*unstructured.Unstructured, time.Time) {
	t.Helper()
	done := testenv.CreateWorkflow(t, env.Client, ns, "holder", argo.PhaseSucceeded)
	waiter := testenv.CreateWorkflow(t, env.Client, ns, "waiter", argo.PhasePending)
	status := waiter.Object["status"].(map[string]any)
	status["message"] = "Waiting for " + lock + " lock. Lock status: 0/1"
	status["synchronization"] = map[string]any{"mutex": map[string]any{
		"waiting": []any{map[string]any{"mutex": lock, "holder": ns + "/" + done.GetName()}}}}
	cause := time.Now()
	if err := env.Client.Update(t.Context(), waiter); err != nil {
		t.Fatal(err)
	}
	return waiter, cause
}

// setFailurePolicy sets the failure policy of the chart's pod webhook as registered (not on
// t's context: it also runs in a cleanup, after that context ended).
func setFailurePolicy(t *testing.T, p admissionregistrationv1.FailurePolicyType) {
	t.Helper()
	ctx := context.Background()
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := env.Client.Get(ctx, types.NamespacedName{Name: "exit-guard"}, &vwc); err != nil {
		t.Fatal(err)
	}
	for i := range vwc.Webhooks {
		if vwc.Webhooks[i].Name == "validate.exit-guard.io" {
			vwc.Webhooks[i].FailurePolicy = &p
		}
	}
	if err := env.Client.Update(ctx, &vwc); err != nil {
		t.Fatal(err)
	}
}

// TestMoreAlertsOnTheRealTools: further alerts, each from its real cause, on a stack of its own.
func TestMoreAlertsOnTheRealTools(t *testing.T) {
	var timings []timing
	defer logTimings(t, &timings)

	t.Run("ExitGuardWebhookRejectingWithErrors: failurePolicy Fail and no guard", func(t *testing.T) {
		st := startStack(t)
		ns := newNamespace(t)
		setFailurePolicy(t, admissionregistrationv1.Fail)
		t.Cleanup(func() { setFailurePolicy(t, admissionregistrationv1.Ignore) })
		cause := time.Now()
		stop := createExitHandlers(t, ns, "fail")
		n, fired := st.waitNotified(t, "ExitGuardWebhookRejectingWithErrors", "firing", cause, 120*time.Second,
			map[string]string{"name": "validate.exit-guard.io", "error_type": "calling_webhook_error"})
		if !strings.Contains(n.Annotations["summary"], "rejects requests on the exit-guard webhook validate.exit-guard.io with errors (calling_webhook_error)") {
			t.Errorf("summary %q", n.Annotations["summary"])
		}
		stop()
		end := time.Now()
		_, resolved := st.waitNotified(t, "ExitGuardWebhookRejectingWithErrors", "resolved", end, 120*time.Second, nil)
		timings = append(timings, timing{alert: "ExitGuardWebhookRejectingWithErrors", fired: fired, resolved: resolved})
	})

	t.Run("ExitGuardWebhookClientsRefused: the guard asks for a client certificate the API server does not present", func(t *testing.T) {
		st := startStack(t)
		ns := newNamespace(t)
		caFile := filepath.Join(t.TempDir(), "ca.crt")
		if err := os.WriteFile(caFile, env.WebhookCAData, 0o600); err != nil {
			t.Fatal(err)
		}
		cause := time.Now()
		st.guard(t, "--webhook-client-ca-file="+caFile)
		stop := createExitHandlers(t, ns, "mtls")
		n, fired := st.waitNotified(t, "ExitGuardWebhookClientsRefused", "firing", cause, 120*time.Second,
			map[string]string{"reason": "no-certificate", "pod": "exit-guard-a"})
		if !strings.Contains(n.Annotations["description"], "TLS handshakes in 20s without a client certificate of the configured CA") {
			t.Errorf("description %q", n.Annotations["description"])
		}
		// The guard is ready all along (its readiness probe presents a certificate of its own).
		if _, ok := st.recv.First("ExitGuardNoReadyReplica", "firing", cause); ok {
			t.Error("ExitGuardNoReadyReplica fired: the readiness probe's own handshake was refused")
		}
		stop()
		end := time.Now()
		st.guard(t)
		_, resolved := st.waitNotified(t, "ExitGuardWebhookClientsRefused", "resolved", end, 120*time.Second, nil)
		timings = append(timings, timing{alert: "ExitGuardWebhookClientsRefused", fired: fired, resolved: resolved})
	})

	t.Run("ExitGuardSyncLockStuck: a workflow waits on a lock a completed workflow holds", func(t *testing.T) {
		st := startStack(t)
		st.guard(t, "--lock-check-interval=1s", "--lock-stuck-after=1s")
		ns := newNamespace(t)
		lock := ns + "/Mutex/probe"
		waiter, cause := waitOnLock(t, ns, lock)
		n, fired := st.waitNotified(t, "ExitGuardSyncLockStuck", "firing", cause, 120*time.Second,
			map[string]string{"workflow_namespace": ns, "lock": lock})
		if !strings.Contains(n.Annotations["summary"], "Workflows in "+ns+" wait on "+lock) {
			t.Errorf("summary %q", n.Annotations["summary"])
		}
		// The cause ends: the waiter is gone (as when the controller, restarted, runs it).
		if err := env.Client.Delete(t.Context(), waiter); err != nil {
			t.Fatal(err)
		}
		end := time.Now()
		_, resolved := st.waitNotified(t, "ExitGuardSyncLockStuck", "resolved", end, 120*time.Second, nil)
		timings = append(timings, timing{alert: "ExitGuardSyncLockStuck", fired: fired, resolved: resolved})
	})

	t.Run("ExitGuardNeverCalled: workflows complete and no pod reaches the guard", func(t *testing.T) {
		st := startStack(t, "prometheusRule.neverCalledAfterCompletions=3", "prometheusRule.neverCalledWindow=1m")
		st.guard(t)
		ns := newNamespace(t)
		waitQuery(t, st, `exit_guard_workflow_completions_total{namespace="argo"}`)
		cause := time.Now()
		for i := range 3 {
			wf := testenv.CreateWorkflow(t, env.Client, ns, "quiet-"+strconv.Itoa(i), argo.PhaseRunning)
			fixture.MarkPhase(wf, argo.PhaseSucceeded)
			if err := env.Client.Update(t.Context(), wf); err != nil {
				t.Fatal(err)
			}
		}
		n, fired := st.waitNotified(t, "ExitGuardNeverCalled", "firing", cause, 120*time.Second, nil)
		// At least the 3 of this test (the count is increase()'s, over the window).
		var completed int
		if _, err := fmt.Sscanf(n.Annotations["description"], "%d workflows completed within 1m and the pod webhook received no admission", &completed); err != nil || completed < 3 {
			t.Errorf("description %q", n.Annotations["description"])
		}
		// An exit handler reaches the guard again.
		end := time.Now()
		running := testenv.CreateWorkflow(t, env.Client, ns, "called", argo.PhaseRunning)
		if err := env.Client.Create(t.Context(), fixture.ExitPod(running)); err != nil {
			t.Fatal(err)
		}
		_, resolved := st.waitNotified(t, "ExitGuardNeverCalled", "resolved", end, 120*time.Second, nil)
		if resolved > 30*time.Second {
			t.Errorf("resolved %s after the guard was called: only when the completions left the 1m window, so the admission was not seen", resolved)
		}
		timings = append(timings, timing{alert: "ExitGuardNeverCalled", fired: fired, resolved: resolved})
	})

	t.Run("ExitGuardAPIServerMetricsMissing: the API server is not scraped", func(t *testing.T) {
		st := startStackWith(t, false)
		st.guard(t)
		cause := time.Now()
		n, fired := st.waitNotified(t, "ExitGuardAPIServerMetricsMissing", "firing", cause, 120*time.Second, nil)
		if !strings.Contains(n.Annotations["summary"], "The API server's metrics are not scraped") {
			t.Errorf("summary %q", n.Annotations["summary"])
		}
		// Scrape it: the configuration with the API server's job, reloaded.
		if err := os.Rename(st.config+".with-apiserver", st.config); err != nil {
			t.Fatal(err)
		}
		end := time.Now()
		resp, err := http.Post("http://"+st.prom.Addr+"/-/reload", "", nil) //nolint:noctx // a one-off
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		_, resolved := st.waitNotified(t, "ExitGuardAPIServerMetricsMissing", "resolved", end, 120*time.Second, nil)
		timings = append(timings, timing{alert: "ExitGuardAPIServerMetricsMissing", fired: fired, resolved: resolved})
	})
}
