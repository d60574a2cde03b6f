package webhook

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// refused is a refusal decision of the table's workflow, by the live read.
func refused(reason contract.Reason) decision {
	wf := tableWorkflow
	return decision{deny: true, reason: reason, row: "6", source: sourceLive, wfNamespace: wf.GetNamespace(), wfName: wf.GetName(),
		wfUID: wf.GetUID(), phase: "Succeeded", resourceVersion: "42"}
}

// The reason code travels in the refusal's causes, and a client reads it back from the error
// the API server hands it. The refusal is a 429 TooManyRequests with no retryAfterSeconds: what
// Argo's controller takes as transient (apierrors.IsTooManyRequests, in its
// util/errors.IsTransientErr) and client-go does not retry inside the call (no Retry-After).
func TestRefusalCarriesItsReasonCode(t *testing.T) {
	f := podFacts(t, fixture.ExitPod(tableWorkflow))
	for _, reason := range contract.RefusalReasons {
		t.Run(string(reason), func(t *testing.T) {
			r := refusal(f, refused(reason))
			if r.Allowed || r.Result.Code != http.StatusTooManyRequests || r.Result.Reason != metav1.StatusReasonTooManyRequests {
				t.Fatalf("refusal = allowed %v code %d reason %s, want a 429 TooManyRequests", r.Allowed, r.Result.Code, r.Result.Reason)
			}
			if r.Result.Details.RetryAfterSeconds != 0 {
				t.Errorf("retryAfterSeconds = %d, want none: client-go would retry inside the call and hold Argo's worker", r.Result.Details.RetryAfterSeconds)
			}
			// As the API server wraps a webhook's Status for its client.
			err := &apierrors.StatusError{ErrStatus: *r.Result}
			if !apierrors.IsTooManyRequests(err) || apierrors.IsForbidden(err) {
				t.Errorf("the refusal is not what Argo takes as transient: %v", err)
			}
			if got, ok := contract.RefusalReason(err); !ok || got != reason {
				t.Errorf("RefusalReason = %q %v, want %q", got, ok, reason)
			}
			// A refusal of an earlier release (403 Forbidden, the same cause) still reads back.
			old := *r.Result
			old.Code, old.Reason = http.StatusForbidden, metav1.StatusReasonForbidden
			if got, ok := contract.RefusalReason(&apierrors.StatusError{ErrStatus: old}); !ok || got != reason {
				t.Errorf("RefusalReason of a 403 refusal = %q %v, want %q", got, ok, reason)
			}
		})
	}
}

// TestAnswersByMode: the mode applied once, to the same decision, for every path of every
// kind: enforce refuses, warn admits with a warning and, on a marking path, the mark, dry-run
// admits with the mark only; an object that cannot be marked (a TaskSet write, an Event) gets
// the warning in both.
func TestAnswersByMode(t *testing.T) {
	type want struct {
		allowed, patched, warned bool
		decision                 string
	}
	type answerCase struct {
		name     string
		facts    func(*testing.T) facts
		mutating bool
		mode     Mode
		want     want
	}
	var cases []answerCase
	for _, k := range kinds {
		of := testOf(t, k).refusable
		_, marks := of(t).object.(marker)
		name := string(k.kind)
		cases = append(cases,
			answerCase{name + ", enforce", of, false, ModeEnforce, want{decision: verdictDenied}},
			answerCase{name + ", warn", of, false, ModeWarn, want{allowed: true, warned: true, decision: verdictWarned}},
			answerCase{name + ", dry-run", of, false, ModeDryRun, want{allowed: true, warned: !marks, decision: verdictDryRun}})
		if k.markPath != "" {
			cases = append(cases,
				answerCase{name + ", marking path, warn", of, true, ModeWarn, want{allowed: true, patched: true, warned: true, decision: verdictWarned}},
				answerCase{name + ", marking path, dry-run", of, true, ModeDryRun, want{allowed: true, patched: true, decision: verdictDryRun}})
		}
	}
	if len(cases) < 11 {
		t.Fatalf("%d cases: the pod's five, the TaskSet write's three and the Event's three at least", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, err := newGuard(nil, storeFor(t, tableWorkflow, storeEmpty, false), Options{Mode: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			h := &handler{guard: g, mutating: tc.mutating}
			f, d := tc.facts(t), refused(contract.ReasonWorkflowCompleted)
			r := h.answer(t.Context(), f, d, verdictOf(d, tc.mode))
			got := want{allowed: r.Allowed, patched: len(r.Patches) > 0, warned: len(r.Warnings) > 0, decision: r.AuditAnnotations["decision"]}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
			if got.warned && !strings.Contains(r.Warnings[0], "("+string(tc.mode)+" mode) would refuse") {
				t.Errorf("warning %q does not say the mode", r.Warnings[0])
			}
		})
	}
	// An admission is an admission in every mode, with its reason.
	for _, mode := range []Mode{ModeEnforce, ModeWarn, ModeDryRun} {
		d := decision{reason: contract.ReasonWorkflowNotTerminal}
		if v := verdictOf(d, mode); v != verdictAllowed {
			t.Errorf("an admission in %s mode has verdict %s", mode, v)
		}
	}
}

// The refusal says what was refused, which workflow, what the guard saw and where to look.
func TestRefusalMessagesSayWhatWasRefused(t *testing.T) {
	key, _ := fixture.OnExitTask(tableWorkflow)
	for _, tc := range []struct {
		name  string
		facts func(*testing.T) facts
		d     decision
		want  []string
	}{
		{"an exit-handler pod", func(t *testing.T) facts { return podFacts(t, fixture.ExitPod(tableWorkflow)) }, refused(contract.ReasonWorkflowCompleted),
			[]string{"exit-guard refused exit-handler pod", "for node notify.onExit[0].notify", "workflow argo/notify (uid uid-notify) already reached Succeeded (resourceVersion 42)", "as seen by live-read", "run it again", "kubectl -n argo get events"}},
		{"an agent pod of a deleted workflow", func(t *testing.T) facts { return podFacts(t, fixture.AgentPod(tableWorkflow)) }, refused(contract.ReasonWorkflowDeleted),
			[]string{"agent pod", "(the workflow's HTTP and plugin tasks)", "workflow argo/notify (uid uid-notify) no longer exists"}},
		{"a TaskSet write of a replaced workflow", func(t *testing.T) facts {
			return taskSetFacts(t, tableWorkflow, []string{}, "true", []string{key}, "false")
		}, refused(contract.ReasonWorkflowReplaced),
			[]string{"a write to WorkflowTaskSet argo/notify that adds task " + key + " (the exit handler notify.onExit)", "the completed label set back", "that name now belongs to another workflow", "run its HTTP or plugin tasks again"}},
		{"a failure Event of a succeeded workflow", func(t *testing.T) facts { return eventFacts(t, tableWorkflow, argo.EventReasonWorkflowFailed) },
			refused(contract.ReasonWorkflowSucceeded),
			[]string{"exit-guard refused the Warning WorkflowFailed Event argo/notify.", "recorded by workflow-controller", "already reached Succeeded", "report it as failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := denialMessage(tc.facts(t), tc.d)
			for _, s := range tc.want {
				if !strings.Contains(msg, s) {
					t.Errorf("message %q does not say %q", msg, s)
				}
			}
		})
	}
}
