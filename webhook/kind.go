package webhook

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"gomodules.xyz/jsonpatch/v2"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/completionstore"
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
	// path is the path of its validating webhook, whose requests read decodes (readReview);
	// the +kubebuilder:webhook marker beside its reader says how the API server is to call it,
	// and make manifests turns that into the chart's webhook. markPath, when set, is the path
	// of its mutating webhook, which marks suspect objects (its objects are markers) in warn
	// and dry-run mode.
	path, markPath string
	read           func([]byte) (request, facts, *admission.Response)
	// rowPrefix begins the names of its own rows of docs/decisions.md ("T1"); the shared rows
	// and the pod's are plain numbers.
	rowPrefix string
	// roles are how the objects of each of its roles are decided; a role not in it is read
	// live first, within --live-read-budget.
	roles map[role]roleRule
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
	// afterOverturn says, in the Event of a refusal overturned, what becomes of an object of
	// its kind that was refused wrongly; empty: Argo's controller writes it again on its next
	// pass.
	afterOverturn string

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
	// newOwn, when set, makes what the kind's own rows keep beside the guard (their memory),
	// when the guard is made: the guard holds it by kind.
	newOwn func(o Options) any
	// start, when set, readies what the kind's own rows keep beside the guard when setup
	// registers its paths: its metrics on reg, its listeners of the store's observations.
	start func(g *guard, reg prometheus.Registerer, store *completionstore.Store) error
}

// roleRule is how the objects of one role are decided.
type roleRule struct {
	// storeFirst: decided from the store first while its watch is fresh (rows 16 to 18), even
	// without --store-first: objects a workflow sends many of, where a live read each would
	// cost the common case an API call.
	storeFirst bool
	// budget bounds its live read.
	budget readBudget
}

// readBudget says which bound a live read keeps (readPolicyOf).
type readBudget int

const (
	// budgetLive: --live-read-budget, for the objects a workflow sends one or two of.
	budgetLive readBudget = iota
	// budgetHookStep: --hook-step-read-budget, for those it sends many of within one pass of
	// Argo's controller, so that none waits more than a second on the guard.
	budgetHookStep
	// budgetEvent: --event-read-budget, for what Argo's recorder sends one at a time per
	// namespace, so that a slow answer delays every later one.
	budgetEvent
)

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

// kinds are the kinds of object the guard judges: setup serves each one's paths, the metrics
// create its series, the tests walk its rows. A new kind is its own files and an entry here
// (docs/development.md, "Adding a kind of object").
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
