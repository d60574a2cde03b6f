package webhook

import (
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
)

// object is the object of a request as the reader of its kind saw it: what the answer and the
// audit say of it, in its kind's words. The decision takes only its kind's rows from it (spec); a
// new kind of object brings a reader, an object, its kindSpec and its rows of docs/decisions.md.
type object interface {
	// spec is what is the same for every object of its kind.
	spec() *kindSpec
	// refused names it in a refusal: "exit-handler pod p for node n".
	refused() string
	// eventAction is the action of the guard's Event about it: "CreatePod".
	eventAction(op admissionv1.Operation) string
	// eventRefused begins the note of that Event: "exit-handler pod p (node n) refused".
	eventRefused() string
	// logValues are its keys and values in the guard's log lines.
	logValues() []any
	// annotate adds its own audit annotations.
	annotate(a map[string]string)
	// mark is the patch that marks it as suspect in warn and dry-run mode, on the mutating
	// path; nil for a kind that cannot be marked, which is admitted with a warning instead.
	mark(msg string) []jsonpatch.Operation
}

// kindSpec is what is the same for every object of one kind: its words, its rows of
// docs/decisions.md that answer from the request alone, the guard's Event about it, and the
// reasons it can be refused for.
type kindSpec struct {
	kind objectKind
	// noun names it in a warning: "pod", "write"; retried says what a stale copy that sends it
	// tries to do: "run it again".
	noun, retried string
	// logs are the constant messages of its log lines.
	logs logMessages
	// The type and reasons of the guard's Event on the workflow about a refusal (verdict
	// denied) and a would-be refusal (warned).
	eventType, eventDenied, eventWarned string
	// The rows of a request that names no Workflow, of a namespace not watched, and of one the
	// policy does not judge (none for pods: they all start work), with the reason of the last.
	rowNotOwned, rowNotWatched, rowIdle string
	idleReason                          Reason
	// refusals are the reasons it can be refused for, admissions those it can be admitted for:
	// its decision series, created at 0 (initDecisions), and no others (TestDecisionTable checks
	// both lists against the decisions of every row of its kind).
	refusals, admissions []Reason
	// staleFailure: a refusal is a stale pass of Argo's controller that marked the workflow
	// failed in its memory, counted by workflow (exit_guard_stale_failures_total).
	staleFailure bool
}

// auditEvent is the type and reason of the guard's Event about a refusal of verdict.
func (k *kindSpec) auditEvent(verdict string) (string, string) {
	if verdict == verdictWarned {
		return k.eventType, k.eventWarned
	}
	return k.eventType, k.eventDenied
}

// kinds are the kinds of object the guard judges.
var kinds = []*kindSpec{podSpec, taskSetSpec, eventSpec}

// logMessages are the messages of the guard's log lines about one kind of object.
type logMessages struct {
	refused, unverified, unconfirmed, admitted string
}
