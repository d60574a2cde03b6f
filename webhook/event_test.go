//go:build envtest

package webhook

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// recordFailed creates, as Argo's recorder does (core/v1, through the API server), the
// WorkflowFailed Event of the copy of wf it holds, and returns the Event and the error.
func recordFailed(t *testing.T, wf *unstructured.Unstructured) (*corev1.Event, error) {
	t.Helper()
	ev := fixture.WorkflowEvent(wf, argo.EventReasonWorkflowFailed, "child '"+wf.GetName()+"-1' failed")
	return ev, env.Client.Create(t.Context(), ev)
}

// The stale copy's WorkflowFailed Event of a workflow that Succeeded is refused, with the
// audit of every refusal; the real failure's, and that of a running workflow, are admitted.
func TestFailureEventOfASucceededWorkflowIsRefused(t *testing.T) {
	h := startGuard(t, Options{}, harnessOptions{})
	ns := newNamespace(t)
	done := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	stale := done.DeepCopy()
	stale.SetResourceVersion("1") // the copy the stale pass reconciled
	calls := env.WebhookCalls(t, "validate-event.exit-guard.io")
	before := calls()
	_, err := recordFailed(t, stale)
	wantRefused(t, err, contract.ReasonWorkflowSucceeded)
	wantSource(t, done, sourceLive)

	ev := waitEvent(t, ns, done, contract.EventReasonFailureEventDenied)
	// The guard's own Event (events.k8s.io, Normal) never reached the Event path: one call,
	// the refused one.
	if got := calls() - before; got != 1 {
		t.Errorf("the API server called the Event path %v times for one failure Event and the guard's own, want 1", got)
	}
	if ev.Type != corev1.EventTypeNormal || !strings.Contains(ev.Note, "WorkflowFailed Event") || ev.Action != "CreateEvent" {
		t.Errorf("the guard's Event = %s %s %q, want a Normal CreateEvent that names the refused WorkflowFailed Event", ev.Type, ev.Action, ev.Note)
	}
	if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "denied", "kind": "Event", "reason": string(contract.ReasonWorkflowSucceeded)}); got != 1 {
		t.Errorf("denied Event decisions = %v, want 1", got)
	}
	// The stale pass is counted by workflow, for the users who correct Argo's user metrics.
	if got := h.counter(t, "exit_guard_stale_failures_total", map[string]string{"workflow_namespace": ns, "workflow": done.GetName()}); got != 1 {
		t.Errorf("exit_guard_stale_failures_total of the workflow = %v, want 1", got)
	}
	lines := guardLog.Lines(`"msg":"stale workflow failure Event refused"`, `"workflowUID":"`+string(done.GetUID())+`"`)
	if len(lines) != 1 || !strings.Contains(lines[0], `"involvedResourceVersion":"1"`) || !strings.Contains(lines[0], `"row":"E4"`) {
		t.Errorf("refusal log lines %v, want one naming the stale copy's resourceVersion and row E4", lines)
	}

	for _, phase := range []argo.Phase{argo.PhaseFailed, argo.PhaseError, argo.PhaseRunning, argo.PhaseUnknown} {
		wf := createWorkflow(t, ns, "wf-"+strings.ToLower(string(phase))+"x", phase)
		if _, err := recordFailed(t, wf); err != nil {
			t.Errorf("the WorkflowFailed Event of a workflow %q: %v, want it admitted", phase, err)
		}
	}
	// Only the refused Event counted: the admitted ones are no stale passes.
	if got := h.counter(t, "exit_guard_stale_failures_total", nil); got != 1 {
		t.Errorf("exit_guard_stale_failures_total over all workflows = %v, want 1", got)
	}
}

// Labels alone never refuse an Event: a workflow whose labels say Succeeded over a status that
// says Running (Argo never writes this) keeps its failure Event, whatever the deny phases.
func TestFailureEventIsDecidedFromTheStatus(t *testing.T) {
	startGuard(t, Options{DenyPhases: []argo.Phase{argo.PhaseFailed}}, harnessOptions{noWatch: true})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "labels-only", argo.PhaseRunning)
	labels := wf.GetLabels()
	labels[argo.LabelPhase], labels[argo.LabelCompleted] = string(argo.PhaseSucceeded), "true"
	wf.SetLabels(labels)
	if err := env.Client.Update(t.Context(), wf); err != nil {
		t.Fatal(err)
	}
	if _, err := recordFailed(t, wf); err != nil {
		t.Errorf("the failure Event of a workflow whose status says Running: %v, want it admitted", err)
	}
	done := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	_, err := recordFailed(t, done)
	wantRefused(t, err, contract.ReasonWorkflowSucceeded)
}

// Written through events.k8s.io/v1 (as a newer recorder would), the same Event is judged too:
// the API server converts it for a webhook registered, with matchPolicy Equivalent, on core/v1.
func TestFailureEventThroughEventsAPIIsJudgedToo(t *testing.T) {
	startGuard(t, Options{}, harnessOptions{})
	ns := newNamespace(t)
	done := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	failed := createWorkflow(t, ns, "failed", argo.PhaseFailed)
	newEvent := func(wf client.Object) *eventsv1.Event {
		return &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: wf.GetName() + "." + rand.String(8)},
			EventTime:  metav1.NewMicroTime(time.Now()), ReportingController: "workflow-controller", ReportingInstance: "wc-0",
			Action: "Reconcile", Reason: argo.EventReasonWorkflowFailed, Type: corev1.EventTypeWarning, Note: "child failed",
			Regarding: corev1.ObjectReference{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind, Namespace: ns,
				Name: wf.GetName(), UID: wf.GetUID(), ResourceVersion: wf.GetResourceVersion()},
		}
	}
	wantRefused(t, env.Client.Create(t.Context(), newEvent(done)), contract.ReasonWorkflowSucceeded)
	if err := env.Client.Create(t.Context(), newEvent(failed)); err != nil {
		t.Errorf("a real failure's Event through events.k8s.io: %v, want it admitted", err)
	}
}

// A real failure's Event can land after its workflow was deleted (a TTL): with no record of the
// workflow it is admitted; only a tombstone of a Succeeded workflow refuses.
func TestFailureEventOfADeletedWorkflow(t *testing.T) {
	h := startGuard(t, Options{}, harnessOptions{})
	ns := newNamespace(t)
	succeeded := createWorkflow(t, ns, "succeeded-then-deleted", argo.PhaseSucceeded)
	waitStore(t, h.store, succeeded, argo.PhaseSucceeded)
	failed := createWorkflow(t, ns, "failed-then-deleted", argo.PhaseFailed)
	waitStore(t, h.store, failed, argo.PhaseFailed)
	for _, wf := range []*unstructured.Unstructured{succeeded, failed} {
		if err := env.Client.Delete(t.Context(), wf); err != nil {
			t.Fatal(err)
		}
		waitTombstone(t, h.store, wf)
	}
	_, err := recordFailed(t, succeeded)
	wantRefused(t, err, contract.ReasonWorkflowSucceeded)
	wantSource(t, succeeded, sourceStore)
	if _, err := recordFailed(t, failed); err != nil {
		t.Errorf("the Event of a failed workflow deleted since: %v, want it admitted", err)
	}
	// A workflow the guard never saw: gone, nothing says it succeeded.
	unknown := fixture.Workflow(ns, "never-seen")
	unknown.SetUID(types.UID("00000000-0000-4000-8000-" + rand.String(12)))
	if _, err := recordFailed(t, unknown); err != nil {
		t.Errorf("the Event of a workflow never seen: %v, want it admitted", err)
	}
	// A name used again: the Event names the first workflow's UID, which failed.
	reused := createWorkflow(t, ns, "failed-then-deleted", argo.PhaseSucceeded)
	if reused.GetUID() == failed.GetUID() {
		t.Fatal("re-created workflow kept its UID")
	}
	if _, err := recordFailed(t, failed); err != nil {
		t.Errorf("the Event of a failed workflow whose name is now another's: %v, want it admitted", err)
	}
}

// client-go's correlator sends a repeat of an Event (same reason and message) as a PATCH of
// the existing one: an UPDATE, judged as the create was.
func TestRepeatedFailureEventPatchIsJudged(t *testing.T) {
	startGuard(t, Options{}, harnessOptions{})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "flaky", argo.PhaseRunning)
	ev, err := recordFailed(t, wf)
	if err != nil {
		t.Fatalf("the WorkflowFailed Event of a running workflow: %v, want it admitted", err)
	}
	repeat := func() error {
		// What recordEvent sends for a repeat: count, lastTimestamp and message, as a
		// strategic merge patch.
		patch := client.RawPatch(types.StrategicMergePatchType, fixture.JSON(map[string]any{
			"count": ev.Count + 1, "lastTimestamp": metav1.Now(), "message": ev.Message}))
		return env.Client.Patch(context.Background(), ev, patch)
	}
	setPhase(t, wf, argo.PhaseFailed)
	if err := repeat(); err != nil {
		t.Fatalf("the repeat of a real failure's Event: %v, want it admitted", err)
	}
	// Retried, then Succeeded: a stale copy's repeat of the old Event now says something false.
	setPhase(t, wf, argo.PhaseRunning)
	setPhase(t, wf, argo.PhaseSucceeded)
	wantRefused(t, repeat(), contract.ReasonWorkflowSucceeded)
}

// Other Events about workflows (and the guard's own) never reach the Event path: its match
// conditions leave them to the API server, which counts no call.
func TestOtherEventsNeverReachTheEventPath(t *testing.T) {
	startGuard(t, Options{}, harnessOptions{})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	calls := env.WebhookCalls(t, "validate-event.exit-guard.io")
	before := calls()
	for _, reason := range []string{"WorkflowRunning", "WorkflowSucceeded", "WorkflowTimedOut", contract.EventReasonDenied} {
		if err := env.Client.Create(t.Context(), fixture.WorkflowEvent(wf, reason, "m")); err != nil {
			t.Errorf("a %s Event: %v", reason, err)
		}
	}
	if after := calls(); after != before {
		t.Errorf("the API server called the Event path %v times for Events that are not failure claims, want 0", after-before)
	}
	_, err := recordFailed(t, wf)
	wantRefused(t, err, contract.ReasonWorkflowSucceeded)
	if after := calls(); after != before+1 {
		t.Errorf("the API server called the Event path %v times for one failure claim, want 1", after-before)
	}
}

// exit_guard_stale_failures_total counts the stale passes that refused failure Events show,
// in every mode (warn admits the Event, but the pass has counted Argo's metrics all the same);
// neither a dry-run request nor the same pass's refused exit-handler pod counts.
func TestStaleFailuresAreCountedByWorkflow(t *testing.T) {
	for _, mode := range []Mode{ModeEnforce, ModeWarn} {
		t.Run(string(mode), func(t *testing.T) {
			h := startGuard(t, Options{Mode: mode}, harnessOptions{})
			ns := newNamespace(t)
			done := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
			count := func() float64 {
				t.Helper()
				return h.counter(t, "exit_guard_stale_failures_total", map[string]string{"workflow_namespace": ns, "workflow": done.GetName()})
			}
			_ = env.Client.Create(t.Context(), fixture.ExitPod(done)) // refused, or warned
			ev := fixture.WorkflowEvent(done, argo.EventReasonWorkflowFailed, "child '"+done.GetName()+"-1' failed")
			err := env.Client.Create(t.Context(), ev.DeepCopy(), client.DryRunAll)
			if mode == ModeEnforce {
				wantRefused(t, err, contract.ReasonWorkflowSucceeded)
			}
			if got := count(); got != 0 {
				t.Errorf("after the exit pod and a dry-run request of the Event: %v, want 0", got)
			}
			err = env.Client.Create(t.Context(), ev)
			if mode == ModeEnforce {
				wantRefused(t, err, contract.ReasonWorkflowSucceeded)
			} else if err != nil {
				t.Errorf("warn mode refused the Event: %v", err)
			}
			if got := count(); got != 1 {
				t.Errorf("after the Event: %v, want 1", got)
			}
		})
	}
}
