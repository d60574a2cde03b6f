package webhook

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// The vocabulary of the pipeline, shared by every kind: the facts a reader makes of a request,
// and the decision made of them.

// source says how the guard knew the workflow's state.
type source string

const (
	sourceNone  source = ""
	sourceStore source = "store"
	sourceLive  source = "live-read"
)

// objectKind is the kind of object an admission request is about: the metric label and the
// audit annotation `kind`.
type objectKind string

const (
	kindPod     objectKind = "Pod"
	kindTaskSet objectKind = argo.TaskSetKind
	kindEvent   objectKind = "Event"
)

// role says what part of a workflow an object runs.
type role string

const (
	roleExitHandler role = "exit-handler"
	roleHook        role = "lifecycle-hook"
	roleStep        role = "step"
	// roleAgent is Argo's agent pod, which runs the workflow's HTTP and plugin templates:
	// exit handlers too. Argo creates it only while the workflow runs and deletes it when the
	// workflow completes, so an agent pod for a completed workflow comes from a stale copy.
	roleAgent role = "agent"
	// roleTaskWrite is a WorkflowTaskSet write: it hands the agent tasks to run.
	roleTaskWrite role = "task-write"
	// roleFailureClaim is an Event about a workflow: it may say that the workflow failed.
	roleFailureClaim role = "failure-claim"
)

// facts is what the guard reads from the object of a request, whatever its kind: what decide
// needs, and the object itself (its name, and the words of its kind) for the answer and the
// audit.
type facts struct {
	object    object
	namespace string
	// owner is the Workflow the object names as its owner (a pod's controller reference, a
	// TaskSet's owner reference); nil when there is none.
	owner *metav1.OwnerReference
	role  role
	// component is a pod's workflows.argoproj.io/component label.
	component string
	// startsWork: the object is one the policy judges: a TaskSet write that hands the agent
	// work (adds a task or sets the completed label back), an Event that says the workflow
	// failed. Pods always start work.
	startsWork bool
	// update: the request changes an object that exists (its owner references are those it
	// already had), rather than creating one.
	update bool
	// dryRun: the request will not be persisted; received: when the guard received it.
	dryRun   bool
	received time.Time
	// requester is the user the request was sent for (request.userInfo.username), and
	// unexpected says it is not Options.ExpectedRequester.
	requester  string
	unexpected bool
}

// decision is the guard's verdict on one object, before the mode is applied.
type decision struct {
	deny   bool
	reason contract.Reason
	// row is the row of docs/decisions.md that decided.
	row    string
	source source
	// The owning workflow, when there is one.
	wfNamespace, wfName string
	wfUID               types.UID
	phase               argo.Phase
	resourceVersion     string
	// writtenAt is when the store's state a decision from the store read was written (zero:
	// unknown, or not decided from the store).
	writtenAt time.Time
	// liveErr is the live read's failure, when the store decided instead.
	liveErr error
	// nameHolder is the UID of the workflow a live read found under the owner's name, when
	// it is another workflow (row 9), and nameHolderDone says it has completed.
	nameHolder     types.UID
	nameHolderDone bool
}
