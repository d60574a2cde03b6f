// Package argo holds the few facts about Argo Workflows that exit-guard depends on: the labels
// and annotations of the pods Argo creates, workflow phases, and a Workflow type that decodes
// only the metadata and status.phase of an Argo Workflow, so that megabyte-sized workflows cost
// exit-guard a few hundred bytes each.
package argo

import (
	"fmt"
	"hash/fnv"
	"maps"
	"regexp"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// Group, version and resource names of Argo's Workflow.
const (
	Group    = "argoproj.io"
	Version  = "v1alpha1"
	Kind     = "Workflow"
	Resource = "workflows"
)

// GroupOf is the API group of apiVersion ("argoproj.io/v1alpha1": "argoproj.io"; "v1", the
// core group: "").
func GroupOf(apiVersion string) string {
	group, _, ok := strings.Cut(apiVersion, "/")
	if !ok {
		return ""
	}
	return group
}

// EventReasonWorkflowFailed is the reason of the Event Argo's controller records when it marks
// a workflow Failed or Error (markWorkflowPhase).
const EventReasonWorkflowFailed = "WorkflowFailed"

// Labels and annotations Argo puts on the pods it creates (workflow/common/common.go).
const (
	// LabelWorkflow holds the workflow's name. Names are reused: never key on it.
	LabelWorkflow = "workflows.argoproj.io/workflow"
	// LabelOnExit is present, with value "true", on pods inside an exit handler. Argo tests
	// the presence of the key.
	LabelOnExit = "workflows.argoproj.io/on-exit"
	// LabelComponent is "agent" or "artifact-gc" on those special pods.
	LabelComponent = "workflows.argoproj.io/component"
	// ComponentAgent is LabelComponent's value on the agent pod, which runs a workflow's HTTP
	// and plugin templates (exit handlers among them); it is named <wf>-1340600742-agent.
	ComponentAgent = "agent"
	// AnnotationNodeName holds the full node name, e.g. "wf.onExit[0].notify".
	AnnotationNodeName = "workflows.argoproj.io/node-name"
)

// The containers of Argo's pods that run its executor image (argoexec, of the controller's
// release unless the controller's configuration names another image): the wait sidecar and
// the init container of a node's pod; the agent pod's init and main containers.
const (
	ContainerWait = "wait"
	ContainerInit = "init"
	ContainerMain = "main"
)

// WorkflowTaskSet: the controller hands a workflow's HTTP and plugin tasks to its agent pod
// through one, named like the workflow, in its namespace, with a non-controller owner reference
// to the Workflow. spec.tasks maps node IDs to templates; the agent writes results to
// status.nodes through the status subresource.
const (
	TaskSetKind     = "WorkflowTaskSet"
	TaskSetResource = "workflowtasksets"
	// LabelCompleted is "true" on a TaskSet once its workflow has completed (the agent exits
	// on it), "false" while it runs. Workflows carry it too: see PhaseFromLabels.
	LabelCompleted = "workflows.argoproj.io/completed"
)

// LabelPhase is the label in which Argo's controller repeats a workflow's status.phase.
const LabelPhase = "workflows.argoproj.io/phase"

// NodeID is the ID Argo gives the node named nodeName in workflow wfName (Workflow.NodeID):
// the workflow's name and the FNV-32a hash of the node name, in decimal.
func NodeID(wfName, nodeName string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(nodeName))
	return fmt.Sprintf("%s-%d", wfName, h.Sum32())
}

// OnExitNodeName is the name of the node of a workflow-level exit handler (spec.onExit).
func OnExitNodeName(wfName string) string { return wfName + OnExitMarker }

// Node-name markers (GenerateOnExitNodeName and lifecycle hooks).
const (
	// OnExitMarker is in the node name of every node inside an exit handler. It is not a sign
	// of one: a step or DAG task may be named onExit, onExitCleanup or onExit-notify. Argo marks
	// the pods of an exit handler with LabelOnExit.
	OnExitMarker = ".onExit"
	// HooksMarker is in the node name of every node inside a non-exit lifecycle hook, after the
	// workflow's name (InLifecycleHook).
	HooksMarker = ".hooks."
)

// InLifecycleHook says whether the node named node, of the workflow named workflow, runs inside
// a lifecycle hook other than exit, as far as its name tells: the workflow's own name stripped
// first (a workflow may be named etl.hooks.daily), the rest holds HooksMarker. Argo names such
// nodes <wf>.hooks.<name> (workflow-level) and <parent>.hooks.<name> (a step's or a task's), and
// gives their pods no label of their own. Step and task names cannot hold a dot, so the rest
// holds the marker only under a hook, or under a DAG task named hooks that runs a nested DAG
// (<wf>.hooks.<task>): such a pod is taken for a hook's. A node name that does not start with
// the workflow's name (not one Argo wrote) is not in a hook.
func InLifecycleHook(node, workflow string) bool {
	rest, ok := strings.CutPrefix(node, workflow)
	return ok && workflow != "" && strings.Contains(rest, HooksMarker)
}

// Phase is a workflow phase.
type Phase string

// Workflow phases; the last three are terminal.
const (
	PhaseUnknown   Phase = ""
	PhasePending   Phase = "Pending"
	PhaseRunning   Phase = "Running"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
	PhaseError     Phase = "Error"
)

// PhaseUnsettled is not a phase Argo writes: it stands for a workflow read without its status
// (metadata only) whose labels do not settle its phase (PhaseFromLabels).
const PhaseUnsettled Phase = "Unsettled"

// PhaseFromLabels says what a workflow's labels tell of its status.phase, so that the guard
// can read workflows without their status (whose node tree makes them large). Argo's
// controller writes the phase label with status.phase in the same Update (markWorkflowPhase),
// and the completed label "true" with a terminal phase. The labels settle the phase when
//   - completed is "true" and the phase label terminal: that phase;
//   - completed is not "true" and the phase label Pending or Running: that phase.
//
// Anything else is PhaseUnsettled, and only the status can tell: a workflow not yet
// reconciled (no phase label); a workflow retried by v4.0+, whose status.phase is "" under a
// stale terminal phase label; a workflow with daemon steps on 3.4.x to 3.5.5, whose terminal
// phase can be written before the completed label.
func PhaseFromLabels(labels map[string]string) Phase {
	p := Phase(labels[LabelPhase])
	completed := labels[LabelCompleted] == "true"
	switch {
	case completed && p.Terminal():
		return p
	case !completed && (p == PhasePending || p == PhaseRunning):
		return p
	}
	return PhaseUnsettled
}

// Terminal reports whether p is Succeeded, Failed or Error.
func (p Phase) Terminal() bool {
	return p == PhaseSucceeded || p == PhaseFailed || p == PhaseError
}

// ParsePhase returns the terminal phase named s, case-insensitively.
func ParsePhase(s string) (Phase, bool) {
	for _, p := range []Phase{PhaseSucceeded, PhaseFailed, PhaseError} {
		if strings.EqualFold(s, string(p)) {
			return p, true
		}
	}
	return "", false
}

// GroupVersion is argoproj.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// WorkflowGVK is the GroupVersionKind of Workflow, and WorkflowListGVK that of its list.
var (
	WorkflowGVK     = GroupVersion.WithKind(Kind)
	WorkflowListGVK = GroupVersion.WithKind(Kind + "List")
)

// Workflow is the part of an Argo Workflow that exit-guard reads. Decoding a workflow into it
// skips spec and the status' node tree, which is where a workflow's size lies.
type Workflow struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Status            WorkflowStatus `json:"status,omitempty"`
}

// WorkflowStatus is the part of a workflow's status that exit-guard reads.
type WorkflowStatus struct {
	Phase Phase `json:"phase,omitempty"`
	// StartedAt is when the workflow's run started: `argo retry` sets it anew (the clock of
	// whoever retried it), so a later one than a completion's write means the workflow ran again.
	StartedAt metav1.Time `json:"startedAt,omitempty"`
}

// WorkflowList is a list of Workflows.
type WorkflowList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Workflow `json:"items"`
}

// DeepCopyInto copies w into out.
func (w *Workflow) DeepCopyInto(out *Workflow) {
	*out = *w
	out.TypeMeta = w.TypeMeta
	w.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
}

// DeepCopy returns a copy of w.
func (w *Workflow) DeepCopy() *Workflow {
	if w == nil {
		return nil
	}
	out := new(Workflow)
	w.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (w *Workflow) DeepCopyObject() runtime.Object { return w.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *WorkflowList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &WorkflowList{TypeMeta: l.TypeMeta}
	l.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]Workflow, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}

// NewScheme returns a scheme with the built-in Kubernetes types and Workflow: the one scheme
// of exit-guard's manager, its tests and its demo.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// AddToScheme registers Workflow and WorkflowList under argoproj.io/v1alpha1.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Workflow{}, &WorkflowList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Node types and phases of a workflow's node tree (status.nodes), as the guard reads them.
const (
	NodeTypeHTTP   = "HTTP"
	NodeTypePlugin = "Plugin"
)

// Node is the part of a node of a workflow's status that exit-guard reads.
type Node struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Phase string `json:"phase"`
}

// InExitHandlerOrHook says whether the node of the workflow named workflow runs inside an exit
// handler or a lifecycle hook, as far as its name tells (a status node has no label): after the
// workflow's name, an .onExit segment (GenerateOnExitNodeName: followed by the name's end, a
// child's '.' or '[', or a retry's '('), or HooksMarker. A step or task named onExitCleanup is
// not one; one named onExit, or a DAG task named hooks that runs a nested DAG, is taken for one
// (the safe side for its caller, which admits only what is not). A name that does not start
// with the workflow's is read whole.
func (n Node) InExitHandlerOrHook(workflow string) bool {
	rest, ok := strings.CutPrefix(n.Name, workflow)
	if !ok || workflow == "" {
		rest = n.Name
	}
	return onExitSegment.MatchString(rest) || strings.Contains(rest, HooksMarker)
}

// onExitSegment is an .onExit segment of a node name (InExitHandlerOrHook).
var onExitSegment = regexp.MustCompile(`\.onExit($|[.\[(])`)

// Pending says whether the node has not run to its end: no phase yet, Pending or Running.
func (n Node) Pending() bool {
	return n.Phase == "" || n.Phase == "Pending" || n.Phase == "Running"
}

// WorkflowNodes is a Workflow with the name, type and phase of each node of its status, by node
// ID: what decoding a workflow read whole keeps of it (the node's other fields, the spec and
// the rest of the status are skipped by the decoder, never held).
type WorkflowNodes struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Status            struct {
		Phase Phase           `json:"phase,omitempty"`
		Nodes map[string]Node `json:"nodes,omitempty"`
	} `json:"status,omitempty"`
}

// DeepCopyObject implements runtime.Object.
func (w *WorkflowNodes) DeepCopyObject() runtime.Object {
	if w == nil {
		return nil
	}
	out := &WorkflowNodes{TypeMeta: w.TypeMeta}
	w.DeepCopyInto(&out.ObjectMeta) // ObjectMeta's: WorkflowNodes has no DeepCopyInto of its own
	out.Status.Phase = w.Status.Phase
	if w.Status.Nodes != nil {
		out.Status.Nodes = maps.Clone(w.Status.Nodes)
	}
	return out
}
