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
// audit annotation `kind`. Each kind names its own, and its roles, in its file.
type objectKind string

// role says what part of a workflow an object runs.
type role string

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
	// afterCompletion: the object runs after its workflow completes by design (an artifact-GC
	// pod, another component's), which row 2 admits.
	afterCompletion bool
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
