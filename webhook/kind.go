package webhook

import (
	"context"

	"gomodules.xyz/jsonpatch/v2"

	"github.com/exit-guard/exit-guard/contract"
)

// object is the object of a request as the reader of its kind saw it: what the answer and the
// audit say of it, in its kind's words. The decision takes only its kind's rows from it (spec). A
// new kind of object brings a reader, an object, its kindSpec with its hooks and words, and its
// rows of docs/decisions.md, and edits nothing in decide.go, answer.go or audit.go.
type object interface {
	// spec is what is the same for every object of its kind.
	spec() *kindSpec
	// refused names it in a refusal: "exit-handler pod p for node n".
	refused() string
	// eventRefused begins the note of that Event: "exit-handler pod p (node n) refused".
	eventRefused() string
	// logValues are its keys and values in the guard's log lines.
	logValues() []any
	// annotate adds its own audit annotations.
	annotate(a map[string]string)
	// requeuedWhenRefused says whether Argo's controller sends it again on its next pass when
	// the guard refuses it (storeCompletionRefuses).
	requeuedWhenRefused() bool
	// comesAfterReRunNodes says whether a retried workflow sends it only after its re-run
	// nodes are done (storeCompletionRefuses).
	comesAfterReRunNodes() bool
}

// marker is an object that can be marked as suspect in warn and dry-run mode, on the mutating
// path (a pod): mark is the patch. An object of a kind that cannot be marked is admitted with a
// warning instead.
type marker interface {
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
	idleReason                          contract.Reason
	// refusals are the reasons it can be refused for, admissions those it can be admitted for:
	// its decision series, created at 0 (initDecisions), and no others (TestDecisionTable checks
	// both lists against the decisions of every row of its kind).
	refusals, admissions []contract.Reason
	// staleFailure: a refusal is a stale pass of Argo's controller that marked the workflow
	// failed in its memory, counted by workflow (exit_guard_stale_failures_total).
	staleFailure bool

	// covered says whether the policy judges an object of its kind (row 4); nil: always.
	covered func(o Options, f facts) bool
	// beforeRead, when set, may decide an object of its kind that starts work before the
	// shared rows from 4 on: rows of its own that answer with no read (T7), or with a read of
	// their own (E4 to E12). ok false: the shared decision goes on.
	beforeRead func(g *guard, ctx context.Context, f facts, d decision) (_ decision, ok bool)
	// afterRead, when set, sees the shared decision by the workflow (rows 5 to 19) and returns
	// it, changed by rows of its own (T5, T6), having learnt from it what those rows need.
	afterRead func(g *guard, ctx context.Context, f facts, d decision) decision
	// own are the words of the reasons only this kind decides, where they differ from the
	// shared ones.
	own map[contract.Reason]reasonWords
}

// reasonWords are a kind's own words for one reason; each field left empty keeps the shared one.
type reasonWords struct {
	// message is the refusal's whole message (denialMessage).
	message func(f facts, d decision) string
	// workflow says what the guard knows of the workflow (workflowText).
	workflow func(d decision) string
	// phase is the workflow's state in the note of the guard's Event (phaseOrGone).
	phase string
	// log is the message of the log line; an admission for this reason is always logged.
	log string
	// The type and reason of the guard's Event about a refusal for this reason.
	eventType, eventReason string
}

// auditEvent is the type and reason of the guard's Event about a refusal of verdict.
func (k *kindSpec) auditEvent(verdict string, reason contract.Reason) (string, string) {
	if w := k.own[reason]; w.eventReason != "" {
		return w.eventType, w.eventReason
	}
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

// logsOf are the log messages of a kind whose judged objects are subject ("pod", "failure
// Event"), whose objects are admitted as noun, and whose workflow the store alone can say has
// ended ("completed").
func logsOf(subject, noun, ended string) logMessages {
	return logMessages{
		refused:     "stale workflow " + subject + " refused",
		unverified:  subject + " admitted unverified: the live read failed and the store knows nothing of its workflow",
		unconfirmed: subject + " admitted unverified: the live read failed and only the store says its workflow " + ended,
		admitted:    noun + " admitted",
	}
}
