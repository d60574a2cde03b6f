package webhook

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// The agent runs a workflow's HTTP and plugin templates (exit handlers among them) from the
// tasks the controller writes into the workflow's WorkflowTaskSet. A stale copy of a completed
// workflow re-runs an HTTP exit handler by adding its task there (and setting the completed
// label back to "false"): the agent pod still running, or a new one, then calls the URL again.
// This path refuses such writes as the pod paths refuse pods. It is registered for the main
// resource only: the agent's and the controller's result writes go to /status and never reach
// the guard. Its match conditions send only the writes that start work: a new task, or the
// completed label turned back from "true"; cleanup and every other write never reach the guard.
//
// +kubebuilder:webhook:path=/validate-workflowtaskset,mutating=false,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups=argoproj.io,resources=workflowtasksets,verbs=create;update,versions=v1alpha1,name=validate-taskset.exit-guard.io,admissionReviewVersions=v1,timeoutSeconds=5,matchPolicy=Equivalent,patch=`{"matchConditions":[{"name":"owned-by-argo-workflow","expression":"has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, r.kind == 'Workflow' && r.apiVersion.startsWith('argoproj.io/'))"},{"name":"adds-a-task-or-reopens","expression":"request.operation == 'CREATE' ? (has(object.spec.tasks) && size(object.spec.tasks) > 0) : ((has(object.spec.tasks) && object.spec.tasks.exists(k, !has(oldObject.spec.tasks) || !(k in oldObject.spec.tasks))) || (has(oldObject.metadata.labels) && 'workflows.argoproj.io/completed' in oldObject.metadata.labels && oldObject.metadata.labels['workflows.argoproj.io/completed'] == 'true' && !(has(object.metadata.labels) && 'workflows.argoproj.io/completed' in object.metadata.labels && object.metadata.labels['workflows.argoproj.io/completed'] == 'true')))"}]}`

// ValidateTaskSetPath is the path of the WorkflowTaskSet webhook. It is a validating webhook in
// every mode: there is nothing to mark on a TaskSet, so in warn and dry-run mode it admits a
// suspect write with an admission warning.
const ValidateTaskSetPath = "/validate-workflowtaskset"

const kindTaskSet objectKind = argo.TaskSetKind

// roleTaskWrite is a WorkflowTaskSet write: it hands the agent tasks to run.
const roleTaskWrite role = "task-write"

var taskSetResource = metav1.GroupVersionResource{Group: argo.Group, Version: argo.Version, Resource: argo.TaskSetResource}

// taskSet is the part of a WorkflowTaskSet the guard decodes: its metadata and the keys of
// spec.tasks (the templates stay raw).
type taskSet struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		Tasks map[string]json.RawMessage `json:"tasks"`
	} `json:"spec"`
}

// readTaskSetReview is the reader of the TaskSet path: the review decoded once, of each object
// its metadata and the keys of its tasks, each task's template kept raw for its digest.
var readTaskSetReview = readReview("a WorkflowTaskSet", readTaskSet)

// readTaskSet checks that req is a CREATE or UPDATE of a WorkflowTaskSet's main resource and
// reads what it adds. A nil response means go on; otherwise it is the answer: allowed for
// requests that are not ours, 400 for malformed ones.
func readTaskSet(req *reviewRequest[taskSet]) (facts, *admission.Response) {
	ts := &taskSetObject{}
	f := facts{object: ts, role: roleTaskWrite}
	// matchPolicy Equivalent may send another version of the resource: group and resource
	// are what count. The tasks' keys and the label mean the same in every version Argo has.
	if req.Resource.Group != taskSetResource.Group || req.Resource.Resource != taskSetResource.Resource || req.SubResource != "" {
		return f, allowed(fmt.Sprintf("exit-guard's WorkflowTaskSet path only reviews %s.%s, not %s",
			taskSetResource.Resource, taskSetResource.Group, resourceName(req.Resource, req.SubResource)))
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return f, allowed(fmt.Sprintf("exit-guard only reviews WorkflowTaskSet creation and updates, not %s", req.Operation))
	}
	if req.Object == nil {
		return f, errored(http.StatusBadRequest, errors.New("malformed AdmissionReview: request.object is empty"))
	}
	obj, old := req.Object, &taskSet{}
	if req.Operation == admissionv1.Update {
		if req.OldObject == nil {
			return f, errored(http.StatusBadRequest, errors.New("malformed AdmissionReview: request.oldObject is empty"))
		}
		old = req.OldObject
	}
	f.namespace, ts.name = obj.Metadata.Namespace, obj.Metadata.Name
	if f.namespace == "" {
		f.namespace = req.Namespace
	}
	ts.namespace = f.namespace
	if ts.name == "" {
		ts.name = req.Name
	}
	if ts.name == "" && obj.Metadata.GenerateName != "" {
		ts.name = obj.Metadata.GenerateName + "*"
	}
	// The owner reference Argo sets is not a controller reference.
	for i := range obj.Metadata.OwnerReferences {
		if ref := &obj.Metadata.OwnerReferences[i]; ref.Kind == argo.Kind && argo.GroupOf(ref.APIVersion) == argo.Group {
			f.owner = ref
			break
		}
	}
	if f.owner != nil {
		ts.workflow = f.owner.Name
	}
	for k, tmpl := range obj.Spec.Tasks {
		if _, had := old.Spec.Tasks[k]; !had {
			ts.tasks = append(ts.tasks, k)
			if ts.templates == nil {
				ts.templates = map[string][sha256.Size]byte{}
			}
			ts.templates[k] = templateDigest(tmpl)
		}
	}
	slices.Sort(ts.tasks)
	ts.reopened = req.Operation == admissionv1.Update &&
		old.Metadata.Labels[argo.LabelCompleted] == "true" && obj.Metadata.Labels[argo.LabelCompleted] != "true"
	if ts.reopened && len(ts.tasks) == 0 {
		// A reopen that adds no key (Argo's patch on every pass carries every pending task,
		// and the object may hold them already, a deleted workflow's leftovers included):
		// what it hands the agent is every task of the object after it.
		for k, tmpl := range obj.Spec.Tasks {
			if ts.reopenedTasks == nil {
				ts.reopenedTasks = map[string][sha256.Size]byte{}
			}
			ts.reopenedTasks[k] = templateDigest(tmpl)
		}
	}
	f.startsWork = len(ts.tasks) > 0 || ts.reopened
	f.update = req.Operation == admissionv1.Update
	return f, nil
}

// maxTasksNamed bounds the task keys named in a message, an Event or an audit annotation.
const maxTasksNamed = 5

// tasksText names what a TaskSet write adds. The TaskSet holds node IDs only; the node of a
// workflow-level exit handler is known by its name, <wf>.onExit, and is named as such.
func (ts *taskSetObject) tasksText() string {
	wf := ts.workflow
	onExit := argo.NodeID(wf, argo.OnExitNodeName(wf))
	var parts []string
	for i, k := range ts.tasks {
		if i == maxTasksNamed {
			parts = append(parts, fmt.Sprintf("and %d more", len(ts.tasks)-i))
			break
		}
		if k == onExit {
			parts = append(parts, fmt.Sprintf("%s (the exit handler %s)", k, argo.OnExitNodeName(wf)))
		} else {
			parts = append(parts, k)
		}
	}
	var text string
	switch len(ts.tasks) {
	case 0:
		text = "no new task"
	case 1:
		text = "task " + parts[0]
	default:
		text = "tasks " + strings.Join(parts, ", ")
	}
	if ts.reopened {
		text += ", and the completed label set back from \"true\""
	}
	return text
}

// taskSetObject is a WorkflowTaskSet write: what it adds.
type taskSetObject struct {
	namespace, name string
	// workflow is the name of the Workflow its owner reference names.
	workflow string
	// tasks are the task keys (node IDs) it adds; reopened: it turns the completed label
	// from "true" back.
	tasks []string
	// templates hold the digest of each added task's template as the request carries it
	// (row T6 matches a patch to the create before it by these).
	templates map[string][sha256.Size]byte
	reopened  bool
	// reopenedTasks: for a write that reopens and adds no key, the digest of every task of
	// the object after it, by key: what the agent may run once it is reopened.
	reopenedTasks map[string][sha256.Size]byte
}

// handed is what the write hands the agent, for row T6 to vouch for: the tasks it adds, or,
// when it only reopens, every task of the object after it; keys sorted.
func (ts *taskSetObject) handed() ([]string, map[string][sha256.Size]byte) {
	if len(ts.tasks) > 0 || len(ts.reopenedTasks) == 0 {
		return ts.tasks, ts.templates
	}
	keys := slices.Sorted(maps.Keys(ts.reopenedTasks))
	return keys, ts.reopenedTasks
}

var _ object = (*taskSetObject)(nil)

// key is the TaskSet's namespace and name: what the memory of admitted creates is keyed by.
func (ts *taskSetObject) key() types.NamespacedName {
	return types.NamespacedName{Namespace: ts.namespace, Name: ts.name}
}

var taskSetSpec = &kindSpec{
	kind: kindTaskSet, path: ValidateTaskSetPath, read: readTaskSetReview, rowPrefix: "T",
	noun: "write", retried: "run its HTTP or plugin tasks again",
	logs:      logsOf("WorkflowTaskSet write", "WorkflowTaskSet write", "completed"),
	eventType: corev1.EventTypeWarning, eventDenied: contract.EventReasonDenied, eventWarned: contract.EventReasonWarned,
	rowNotOwned: "T1", rowNotWatched: "T2", rowIdle: "T3", idleReason: contract.ReasonNoNewTask,
	refusals: []contract.Reason{contract.ReasonWorkflowCompleted, contract.ReasonWorkflowDeleted, contract.ReasonWorkflowReplaced, contract.ReasonTaskSetOwnerGone},
	admissions: []contract.Reason{contract.ReasonNotOwnedByWorkflow, contract.ReasonNamespaceNotWatched, contract.ReasonNoNewTask, contract.ReasonRepeatsAdmittedCreate,
		contract.ReasonWorkflowNotTerminal, contract.ReasonPhaseNotDenied, contract.ReasonNotSeenCompleted, contract.ReasonUnverifiedFailOpen,
		contract.ReasonUnconfirmedCompletion, contract.ReasonTasksOfNameHolder},
	beforeRead: (*guard).taskSetBeforeRead,
	afterRead:  (*guard).taskSetAfterRead,
	newOwn:     newTaskSetOwn,
	start:      startTaskSetRows,
	own: map[contract.Reason]reasonWords{
		contract.ReasonTaskSetOwnerGone: {
			message: func(f facts, d decision) string {
				return fmt.Sprintf("exit-guard refused %s: %s, as seen by %s, and the agent of a workflow of that name would run its tasks. "+
					"If this workflow reused the name, a later write is admitted once the guard can tell it is this workflow's (its create of the same "+
					"tasks just before, judged by the same replica, or, outside exit handlers, their pending nodes in its status), or the garbage collector "+
					"deletes the old WorkflowTaskSet (kubectl -n %s get workflowtaskset %s -o jsonpath='{.metadata.ownerReferences}'); "+
					"a stale copy of the deleted workflow gets no further",
					f.object.refused(), workflowText(f, d), d.source, d.wfNamespace, d.wfName)
			},
			workflow: func(d decision) string {
				return fmt.Sprintf("it still belongs to workflow %s/%s (uid %s), which was deleted", d.wfNamespace, d.wfName, d.wfUID)
			},
			phase: "deleted (the WorkflowTaskSet still names it as its owner)",
			log:   "WorkflowTaskSet update refused: it still belongs to a deleted workflow (perhaps the write of a workflow that reused the name, which waits for the garbage collector)",
			// Normal: perhaps this workflow's own write, which waits for the garbage collector;
			// not a stale exit handler.
			eventType: corev1.EventTypeNormal, eventReason: contract.EventReasonTaskSetOwnerGone,
		},
		contract.ReasonTasksOfNameHolder: {
			log: "WorkflowTaskSet update admitted: it still belongs to a deleted workflow, and the workflow that reused the name sent it (its create of these tasks just before, or their pending nodes in its status)",
		},
	},
}

func (ts *taskSetObject) spec() *kindSpec { return taskSetSpec }

// requeuedWhenRefused: a refused TaskSet write is logged, and written again only when the
// workflow is woken.
func (ts *taskSetObject) requeuedWhenRefused() bool { return false }

// comesAfterReRunNodes: a write that adds only the workflow's exit-handler task; a retry's
// writes of other nodes come at once.
func (ts *taskSetObject) comesAfterReRunNodes() bool { return ts.onlyExitHandlerTask() }

func (ts *taskSetObject) refused() string {
	return fmt.Sprintf("a write to WorkflowTaskSet %s/%s that adds %s", ts.namespace, ts.name, ts.tasksText())
}

func (ts *taskSetObject) eventRefused() string {
	return fmt.Sprintf("write to WorkflowTaskSet %s refused (it adds %s)", ts.name, ts.tasksText())
}

func (ts *taskSetObject) logValues() []any {
	// The first maxTasksNamed tasks and their count: a write may add tens of thousands, and a
	// log line must not grow with them.
	return []any{"workflowTaskSet", ts.namespace + "/" + ts.name, "tasksAdded", ts.tasks[:min(len(ts.tasks), maxTasksNamed)],
		"tasksAddedCount", len(ts.tasks), "completedReopened", ts.reopened}
}

func (ts *taskSetObject) annotate(a map[string]string) {
	if len(ts.tasks) > 0 {
		a["tasks-added"] = strings.Join(ts.tasks[:min(len(ts.tasks), maxTasksNamed)], ",")
	}
	if ts.reopened {
		a["completed-reopened"] = "true"
	}
}

// onlyExitHandlerTask says whether the write adds tasks, every one of them the node of the
// workflow-level exit handler (<wf>.onExit, an onExit template that is itself an HTTP or
// plugin template). The ID of a node inside the exit handler's steps cannot be told from
// another node's without the workflow's node tree.
func (ts *taskSetObject) onlyExitHandlerTask() bool {
	if len(ts.tasks) == 0 {
		return false
	}
	onExit := argo.NodeID(ts.workflow, argo.OnExitNodeName(ts.workflow))
	for _, k := range ts.tasks {
		if k != onExit {
			return false
		}
	}
	return true
}

// templateDigest is the SHA-256 of a task's template with every null left out, re-encoded (keys
// sorted). The API server drops the nulls of the keys a merge patch adds (RFC 7386) and keeps
// them on a create of this schemaless spec, so Argo's create and the patch that follows it
// differ there alone. A template that does not decode is digested as it came.
func templateDigest(raw []byte) [sha256.Size]byte {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return sha256.Sum256(raw)
	}
	b, err := json.Marshal(withoutNulls(v))
	if err != nil {
		return sha256.Sum256(raw)
	}
	return sha256.Sum256(b)
}

// withoutNulls removes the nulls of v, in objects and arrays, at every depth.
func withoutNulls(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if e == nil {
				delete(t, k)
			} else {
				t[k] = withoutNulls(e)
			}
		}
	case []any:
		out := t[:0]
		for _, e := range t {
			if e != nil {
				out = append(out, withoutNulls(e))
			}
		}
		return out
	}
	return v
}
