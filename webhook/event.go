package webhook

import (
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// Argo's controller records a workflow-phase Event (markWorkflowPhase, in the body of
// operate()) before it writes the workflow; client-go's recorder sends it on its own. A stale
// copy of a workflow that Succeeded, whose exit handler the guard refused, is marked Failed in
// that pass, and records WorkflowFailed although its write then fails: the Event that says
// "your workflow failed" for a workflow that succeeded. This path refuses that Event, by the
// workflow's UID, when the workflow is Succeeded, and admits every other (docs/decisions.md,
// rows E1 to E12). It is registered for core/v1 events with matchPolicy Equivalent, so that an
// Event written through events.k8s.io is judged too, converted to core/v1 by the API server.
//
// Its budget is short (Options.EventReadBudget): each namespace's recorder in Argo sends its
// Events one at a time, so a slow answer delays every later Event of that namespace.
//
// Its match condition sends only the Events that say a workflow failed: every other Event of
// the cluster (the guard's own among them) never waits on the guard.
//
// +kubebuilder:webhook:path=/validate-event,mutating=false,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups="",resources=events,verbs=create;update,versions=v1,name=validate-event.exit-guard.io,admissionReviewVersions=v1,timeoutSeconds=2,matchPolicy=Equivalent,patch=`{"matchConditions":[{"name":"workflow-failed","expression":"has(object.reason) && object.reason == 'WorkflowFailed' && has(object.involvedObject.kind) && object.involvedObject.kind == 'Workflow' && has(object.involvedObject.apiVersion) && object.involvedObject.apiVersion.startsWith('argoproj.io/')"}]}`

// ValidateEventPath is the path of the Event webhook. It is a validating webhook in every mode:
// there is nothing to mark on an Event, so in warn and dry-run mode it admits a stale failure
// Event with an admission warning.
const ValidateEventPath = "/validate-event"

const kindEvent objectKind = "Event"

// roleFailureClaim is an Event about a workflow: it may say that the workflow failed.
const roleFailureClaim role = "failure-claim"

var eventResource = metav1.GroupVersionResource{Version: "v1", Resource: "events"}

// eventFields is the part of a core/v1 Event the guard decodes.
type eventFields struct {
	Metadata       metav1.ObjectMeta `json:"metadata"`
	InvolvedObject struct {
		APIVersion      string `json:"apiVersion"`
		Kind            string `json:"kind"`
		Namespace       string `json:"namespace"`
		Name            string `json:"name"`
		UID             string `json:"uid"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"involvedObject"`
	Reason string `json:"reason"`
	Type   string `json:"type"`
	Source struct {
		Component string `json:"component"`
	} `json:"source"`
	ReportingComponent string `json:"reportingComponent"`
}

// readEventReview is the reader of the Event path: the review decoded once, the fields of the
// Event that say what it claims about which workflow.
var readEventReview = readReview("an Event", readEvent)

// readEvent checks that req is a CREATE or UPDATE (the correlator's PATCH of a repeated Event)
// of a core/v1 Event and reads what it claims. A nil response means go on; otherwise it is the
// answer: allowed for requests that are not ours, 400 for malformed ones.
func readEvent(req *reviewRequest[eventFields]) (facts, *admission.Response) {
	ev := &eventObject{}
	f := facts{object: ev, role: roleFailureClaim}
	if req.Resource != eventResource || req.SubResource != "" {
		return f, allowed(fmt.Sprintf("exit-guard's Event path only reviews core/v1 events, not %s", resourceName(req.Resource, req.SubResource)))
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return f, allowed(fmt.Sprintf("exit-guard only reviews Event creation and updates, not %s", req.Operation))
	}
	if req.Object == nil {
		return f, errored(http.StatusBadRequest, errors.New("malformed AdmissionReview: request.object is empty"))
	}
	e := req.Object
	ev.name, ev.reason, ev.eventType, ev.rv = e.Metadata.Name, e.Reason, e.Type, e.InvolvedObject.ResourceVersion
	ev.component = e.Source.Component
	if ev.component == "" {
		ev.component = e.ReportingComponent
	}
	f.namespace = e.InvolvedObject.Namespace
	if f.namespace == "" {
		f.namespace = e.Metadata.Namespace
	}
	if f.namespace == "" {
		f.namespace = req.Namespace
	}
	ev.namespace = f.namespace
	if io := e.InvolvedObject; io.Kind == argo.Kind && argo.GroupOf(io.APIVersion) == argo.Group && io.Name != "" && io.UID != "" {
		f.owner = &metav1.OwnerReference{APIVersion: io.APIVersion, Kind: io.Kind, Name: io.Name, UID: types.UID(io.UID)}
	}
	// Only a claim of failure is judged: WorkflowFailed, recorded when the workflow is marked
	// Failed or Error. WorkflowTimedOut is not one: v3.4 records it on a pod-reconciliation error
	// in a pass that may end non-terminal, so a real one can precede a Succeeded end.
	f.startsWork = e.Reason == argo.EventReasonWorkflowFailed
	return f, nil
}

// eventObject is an Event about a workflow, as its fields say.
type eventObject struct {
	namespace, name   string
	reason, eventType string
	component         string
	rv                string // the involvedObject's resourceVersion: the copy that recorded it
}

var _ object = (*eventObject)(nil)

// eventSpec: the guard's own Event about a refused failure Event is a Normal one, not a
// Warning. What it reports is a false alarm stopped; teams that route Warning Events to chat
// would otherwise get a warning in place of the false one. The guard's ExitHandlerDenied Event
// on the same workflow, when the stale copy's exit handler was refused first, already says
// what happened.
var eventSpec = &kindSpec{
	kind: kindEvent, path: ValidateEventPath, read: readEventReview, rowPrefix: "E",
	// Argo's recorder sends a namespace's Events one at a time: a short budget.
	roles: map[role]roleRule{roleFailureClaim: {budget: budgetEvent}},
	noun:  "Event", retried: "report it as failed",
	logs:      logsOf("failure Event", "Event", "succeeded"),
	eventType: corev1.EventTypeNormal, eventDenied: contract.EventReasonFailureEventDenied, eventWarned: contract.EventReasonFailureEventWarned,
	rowNotOwned: "E1", rowNotWatched: "E2", rowIdle: "E3", idleReason: contract.ReasonNotAFailureClaim,
	refusals: []contract.Reason{contract.ReasonWorkflowSucceeded},
	admissions: []contract.Reason{contract.ReasonNotOwnedByWorkflow, contract.ReasonNamespaceNotWatched, contract.ReasonNotAFailureClaim,
		contract.ReasonClaimMatchesPhase, contract.ReasonWorkflowGone, contract.ReasonWorkflowNotTerminal, contract.ReasonUnverifiedFailOpen,
		contract.ReasonUnconfirmedCompletion},
	// The pass that records a WorkflowFailed Event is the one that counts the workflow's own
	// user metrics: users correct those by this count.
	staleFailure: true,
	// client-go's recorder drops a refused Event and never sends it again.
	afterOverturn: "Argo's recorder does not send a refused Event again: that failure Event is lost",
	beforeRead:    (*guard).eventBeforeRead,
}

func (e *eventObject) spec() *kindSpec { return eventSpec }

// requeuedWhenRefused: a refused Event is dropped.
func (e *eventObject) requeuedWhenRefused() bool { return false }

// comesAfterReRunNodes: a retried workflow says it failed only after its re-run nodes are done.
func (e *eventObject) comesAfterReRunNodes() bool { return true }

func (e *eventObject) refused() string {
	return fmt.Sprintf("the %s %s Event %s/%s (recorded by %s at the workflow's resourceVersion %s)", e.eventType, e.reason, e.namespace, e.name, e.component, e.rv)
}

func (e *eventObject) eventRefused() string {
	return fmt.Sprintf("%s Event %s (recorded at resourceVersion %s) refused", e.reason, e.name, e.rv)
}

func (e *eventObject) logValues() []any {
	return []any{"event", e.namespace + "/" + e.name, "eventReason", e.reason, "eventType", e.eventType,
		"component", e.component, "involvedResourceVersion", e.rv}
}

func (e *eventObject) annotate(a map[string]string) {
	a["event-reason"] = e.reason
}
