package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// The agent runs a workflow's HTTP and plugin templates (exit handlers among them) from the
// tasks the controller writes into the workflow's WorkflowTaskSet. A stale copy of a completed
// workflow re-runs an HTTP exit handler by adding its task there (and setting the completed
// label back to "false"): the agent pod still running, or a new one, then calls the URL again.
// This path refuses such writes as the pod paths refuse pods. It is registered for the main
// resource only: the agent's and the controller's result writes go to /status and never reach
// the guard.
//
// +kubebuilder:webhook:path=/validate-workflowtaskset,mutating=false,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups=argoproj.io,resources=workflowtasksets,verbs=create;update,versions=v1alpha1,name=validate-taskset.exit-guard.io,admissionReviewVersions=v1,timeoutSeconds=5,matchPolicy=Equivalent

// ValidateTaskSetPath is the path of the WorkflowTaskSet webhook. It is a validating webhook in
// every mode: there is nothing to mark on a TaskSet, so in warn and dry-run mode it admits a
// suspect write with an admission warning.
const ValidateTaskSetPath = "/validate-workflowtaskset"

// reasonNoNewTask admits a TaskSet write that adds no task and does not set the completed
// label back from "true": cleanup, or anything else that starts no work.
const reasonNoNewTask reason = "no-new-task"

// taskSetValidator is the handler of ValidateTaskSetPath.
type taskSetValidator struct{ *guard }

var _ admission.Handler = (*taskSetValidator)(nil)

var taskSetResource = metav1.GroupVersionResource{Group: argo.Group, Version: argo.Version, Resource: argo.TaskSetResource}

// taskSet is the part of a WorkflowTaskSet the guard decodes: its metadata and the keys of
// spec.tasks (the templates stay raw).
type taskSet struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		Tasks map[string]json.RawMessage `json:"tasks"`
	} `json:"spec"`
}

// readTaskSet checks that req is a CREATE or UPDATE of a WorkflowTaskSet's main resource and
// reads what it adds. A nil response means go on; otherwise it is the answer: allowed for
// requests that are not ours, 400 for malformed ones.
func readTaskSet(req admission.Request) (facts, *admission.Response) {
	f := facts{object: objectTaskSet}
	if req.UID == "" {
		r := admission.Errored(http.StatusBadRequest, errors.New("malformed AdmissionReview: request.uid is empty"))
		return f, &r
	}
	// matchPolicy Equivalent may send another version of the resource: group and resource
	// are what count. The tasks' keys and the label mean the same in every version Argo has.
	if req.Resource.Group != taskSetResource.Group || req.Resource.Resource != taskSetResource.Resource || req.SubResource != "" {
		r := admission.Allowed(fmt.Sprintf("exit-guard's WorkflowTaskSet path only reviews %s.%s, not %s",
			taskSetResource.Resource, taskSetResource.Group, resourceName(req)))
		return f, &r
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		r := admission.Allowed(fmt.Sprintf("exit-guard only reviews WorkflowTaskSet creation and updates, not %s", req.Operation))
		return f, &r
	}
	var obj, old taskSet
	if err := decodeTaskSet(req.Object.Raw, "object", &obj); err != nil {
		r := admission.Errored(http.StatusBadRequest, err)
		return f, &r
	}
	if req.Operation == admissionv1.Update {
		if err := decodeTaskSet(req.OldObject.Raw, "oldObject", &old); err != nil {
			r := admission.Errored(http.StatusBadRequest, err)
			return f, &r
		}
	}
	f.namespace, f.name = obj.Metadata.Namespace, obj.Metadata.Name
	if f.namespace == "" {
		f.namespace = req.Namespace
	}
	if f.name == "" {
		f.name = req.Name
	}
	if f.name == "" && obj.Metadata.GenerateName != "" {
		f.name = obj.Metadata.GenerateName + "*"
	}
	// The owner reference Argo sets is not a controller reference.
	for i := range obj.Metadata.OwnerReferences {
		if ref := &obj.Metadata.OwnerReferences[i]; ref.Kind == argo.Kind && apiGroup(ref.APIVersion) == argo.Group {
			f.owner = ref
			break
		}
	}
	for k := range obj.Spec.Tasks {
		if _, had := old.Spec.Tasks[k]; !had {
			f.tasks = append(f.tasks, k)
		}
	}
	slices.Sort(f.tasks)
	f.reopened = req.Operation == admissionv1.Update &&
		old.Metadata.Labels[argo.LabelCompleted] == "true" && obj.Metadata.Labels[argo.LabelCompleted] != "true"
	return f, nil
}

func decodeTaskSet(raw []byte, field string, into *taskSet) error {
	if len(raw) == 0 {
		return fmt.Errorf("malformed AdmissionReview: request.%s is empty", field)
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("malformed AdmissionReview: request.%s is not a WorkflowTaskSet: %w", field, err)
	}
	return nil
}

// decideTaskSet is the WorkflowTaskSet rows of docs/decisions.md. A write that adds work while
// the owning workflow has completed comes from a stale copy: Argo adds tasks, and sets the
// label back, only while the workflow runs (a retry runs it again first). Which node a task
// is, only the workflow's status says; every added task counts, whatever its node.
func (g *guard) decideTaskSet(ctx context.Context, f facts) decision {
	if f.owner == nil {
		return decision{reason: reasonNotWorkflowPod}
	}
	d := decision{wfNamespace: f.namespace, wfName: f.owner.Name, wfUID: f.owner.UID}
	if g.watched != nil && !g.watched[f.namespace] {
		d.reason = reasonNamespaceNotWatched
		return d
	}
	if len(f.tasks) == 0 && !f.reopened {
		d.reason = reasonNoNewTask
		return d
	}
	return g.judge(ctx, d, g.opts.StoreFirst)
}

// Handle decides a WorkflowTaskSet write: deny in enforce mode; in warn and dry-run mode admit
// with a warning and the same audit.
func (t *taskSetValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	f, resp := readTaskSet(req)
	if resp != nil {
		return *resp
	}
	d := t.decideTaskSet(ctx, f)
	out := t.audit(ctx, req, f, d)
	if !d.deny {
		return withAudit(admission.Allowed(string(d.reason)), f, d, out)
	}
	msg := denialMessage(f, d)
	switch t.opts.Mode {
	case ModeEnforce:
		return policyDenial(ctx, withAudit(admission.Denied(msg), f, d, out))
	default:
		// Nothing to mark on a TaskSet: the warning reaches Argo's controller log.
		return withAudit(admission.Allowed(string(d.reason)).WithWarnings(
			fmt.Sprintf("exit-guard (%s mode) would refuse this write: %s", t.opts.Mode, msg)), f, d, out)
	}
}

// maxTasksNamed bounds the task keys named in a message, an Event or an audit annotation.
const maxTasksNamed = 5

// tasksText names what a TaskSet write adds. The TaskSet holds node IDs only; the node of a
// workflow-level exit handler is known by its name, <wf>.onExit, and is named as such.
func tasksText(f facts) string {
	var wf string
	if f.owner != nil {
		wf = f.owner.Name
	}
	onExit := argo.NodeID(wf, argo.OnExitNodeName(wf))
	var parts []string
	for i, k := range f.tasks {
		if i == maxTasksNamed {
			parts = append(parts, fmt.Sprintf("and %d more", len(f.tasks)-i))
			break
		}
		if k == onExit {
			parts = append(parts, fmt.Sprintf("%s (the exit handler %s)", k, argo.OnExitNodeName(wf)))
		} else {
			parts = append(parts, k)
		}
	}
	var text string
	switch len(f.tasks) {
	case 0:
		text = "no new task"
	case 1:
		text = "task " + parts[0]
	default:
		text = "tasks " + strings.Join(parts, ", ")
	}
	if f.reopened {
		text += ", and the completed label set back from \"true\""
	}
	return text
}
