package webhook

import (
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
)

// object is the object of a request as the reader of its kind saw it: what the answer and the
// audit say of it, in its kind's words. The decision never looks at it; a new kind of object
// brings a reader, an object and its rows of docs/decisions.md.
type object interface {
	kind() objectKind
	// refused names it in a refusal: "exit-handler pod p for node n".
	refused() string
	// retried says what a stale copy that sends it tries to do: "run it again".
	retried() string
	// noun names it in a warning: "pod", "write".
	noun() string
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
	// messages are the constant messages of its log lines.
	messages() *logMessages
	// auditEvent is the type and reason of the guard's Event on the workflow about a refusal
	// (verdict denied) or a would-be refusal (warned) of it.
	auditEvent(verdict string) (eventType, reason string)
}

// exitHandlerEvent is the guard's Event about a refused (or, in warn mode, would-be refused)
// pod or TaskSet write: a Warning, which teams alert on.
func exitHandlerEvent(verdict string) (string, string) {
	if verdict == verdictWarned {
		return corev1.EventTypeWarning, EventReasonWarned
	}
	return corev1.EventTypeWarning, EventReasonDenied
}

// logMessages are the messages of the guard's log lines about one kind of object.
type logMessages struct {
	refused, unverified, unconfirmed, admitted string
}
