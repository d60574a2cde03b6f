package webhook

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// The two pod paths, as the API server is to call them: only pods that Argo made (the
// workflow label), that a Workflow controls, and that are not artifact GC's. The guard's own
// pods (and everything else) never depend on the guard, so a failing guard cannot block its
// own restart. The chart renders these, with its coverage's conditions and failure policy.
// +kubebuilder:webhook:path=/validate-pod,mutating=false,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups="",resources=pods,verbs=create,versions=v1,name=validate.exit-guard.io,admissionReviewVersions=v1,timeoutSeconds=5,matchPolicy=Equivalent,patch=`{"objectSelector":{"matchExpressions":[{"key":"workflows.argoproj.io/workflow","operator":"Exists"}]},"matchConditions":[{"name":"owned-by-argo-workflow","expression":"has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller && r.kind == 'Workflow' && r.apiVersion.startsWith('argoproj.io/'))"},{"name":"not-artifact-gc","expression":"!has(object.metadata.labels) || !('workflows.argoproj.io/component' in object.metadata.labels) || object.metadata.labels['workflows.argoproj.io/component'] == 'agent'"}]}`
// +kubebuilder:webhook:path=/mutate-pod,mutating=true,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups="",resources=pods,verbs=create,versions=v1,name=mutate.exit-guard.io,admissionReviewVersions=v1,timeoutSeconds=5,matchPolicy=Equivalent,reinvocationPolicy=Never,patch=`{"objectSelector":{"matchExpressions":[{"key":"workflows.argoproj.io/workflow","operator":"Exists"}]},"matchConditions":[{"name":"owned-by-argo-workflow","expression":"has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller && r.kind == 'Workflow' && r.apiVersion.startsWith('argoproj.io/'))"},{"name":"not-artifact-gc","expression":"!has(object.metadata.labels) || !('workflows.argoproj.io/component' in object.metadata.labels) || object.metadata.labels['workflows.argoproj.io/component'] == 'agent'"}]}`

// Paths of the pod webhooks: ValidatePath decides (deny in enforce mode), MutatePath marks
// suspect pods in warn and dry-run mode.
const (
	ValidatePath = "/validate-pod"
	MutatePath   = "/mutate-pod"
)

const kindPod objectKind = "Pod"

// The roles of pods.
const (
	roleExitHandler role = "exit-handler"
	roleHook        role = "lifecycle-hook"
	roleStep        role = "step"
	// roleAgent is Argo's agent pod, which runs the workflow's HTTP and plugin templates:
	// exit handlers too. Argo creates it only while the workflow runs and deletes it when the
	// workflow completes, so an agent pod for a completed workflow comes from a stale copy.
	roleAgent role = "agent"
)

var podResource = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}

// podMetadata is the only part of a pod the guard decodes: its metadata, and the name and image
// of each container (the executor image says which Argo release made the pod: argoversion.go).
type podMetadata struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		InitContainers []containerImage `json:"initContainers"`
		Containers     []containerImage `json:"containers"`
	} `json:"spec"`
}

// containerImage is what the guard decodes of a container.
type containerImage struct {
	Name  string `json:"name"`
	Image string `json:"image"`
}

// executorImage is the image of the pod's Argo executor: its wait container, else its init
// container, else the main container of an agent pod (argoexec agent); "" for none.
func (p *podMetadata) executorImage() string {
	for _, c := range p.Spec.Containers {
		if c.Name == argo.ContainerWait {
			return c.Image
		}
	}
	for _, c := range p.Spec.InitContainers {
		if c.Name == argo.ContainerInit {
			return c.Image
		}
	}
	if p.Metadata.Labels[argo.LabelComponent] == argo.ComponentAgent {
		for _, c := range p.Spec.Containers {
			if c.Name == argo.ContainerMain {
				return c.Image
			}
		}
	}
	return ""
}

// readPodReview is the reader of the pod paths: the review decoded once, the pod's metadata
// alone of its object.
var readPodReview = readReview("a pod", readPod)

// readPod checks that req is a Pod CREATE and reads the pod's metadata. A nil response means
// go on; otherwise it is the answer: allowed for requests that are not ours, 400 for malformed
// ones.
func readPod(req *reviewRequest[podMetadata]) (facts, *admission.Response) {
	if req.Resource != podResource || req.SubResource != "" {
		return facts{}, allowed(fmt.Sprintf("exit-guard only reviews pods, not %s", resourceName(req.Resource, req.SubResource)))
	}
	if req.Operation != admissionv1.Create {
		return facts{}, allowed(fmt.Sprintf("exit-guard only reviews pod creation, not %s", req.Operation))
	}
	if req.Object == nil {
		return facts{}, errored(http.StatusBadRequest, errors.New("malformed AdmissionReview: request.object is empty"))
	}
	pod := req.Object
	if pod.Metadata.Namespace == "" {
		// The API server sends the pod before defaulting its namespace from the request.
		pod.Metadata.Namespace = req.Namespace
	}
	f := classify(&pod.Metadata)
	f.object.(*podObject).executor = pod.executorImage()
	return f, nil
}

// classify reads a pod's metadata: who owns it and what it runs. The owner is nil for a pod
// that has no controlling Workflow (artifact-GC pods are owned by WorkflowArtifactGCTask).
func classify(meta *metav1.ObjectMeta) facts {
	p := &podObject{meta: meta, name: meta.Name, node: meta.Annotations[argo.AnnotationNodeName]}
	if p.name == "" && meta.GenerateName != "" {
		p.name = meta.GenerateName + "*"
	}
	component := meta.Labels[argo.LabelComponent]
	f := facts{object: p, namespace: meta.Namespace, startsWork: true, afterCompletion: component != "" && component != argo.ComponentAgent}
	if ref := metav1.GetControllerOfNoCopy(meta); ref != nil && ref.Kind == argo.Kind && argo.GroupOf(ref.APIVersion) == argo.Group {
		f.owner = ref
	}
	workflow := meta.Labels[argo.LabelWorkflow]
	if f.owner != nil {
		workflow = f.owner.Name
	}
	_, onExitLabel := meta.Labels[argo.LabelOnExit]
	// Roles come from what Argo says of a pod, never from a piece of a name: its component
	// label, its on-exit label (Argo sets it on every pod under an exit handler, and tests the
	// key), and the node name with the workflow's name stripped (argo.InLifecycleHook). A pod
	// those do not place is a step's: the short read budget, never the exit handler's.
	switch {
	case component == argo.ComponentAgent:
		f.role = roleAgent
	case onExitLabel:
		f.role = roleExitHandler
	case argo.InLifecycleHook(p.node, workflow):
		f.role = roleHook
	default:
		f.role = roleStep
	}
	p.role, p.owned = f.role, f.owner != nil
	return f
}

// podObject is a pod, as its metadata says.
type podObject struct {
	meta       *metav1.ObjectMeta
	name, node string
	role       role
	owned      bool
	// executor is the image of its Argo executor (executorImage): observed, never decided on.
	executor string
}

// executorImage is the image of the pod's Argo executor, for argoVersions.
func (p *podObject) executorImage() string { return p.executor }

var _ object = (*podObject)(nil)

var podSpec = &kindSpec{
	kind: kindPod, path: ValidatePath, markPath: MutatePath, read: readPodReview,
	// Exit-handler and agent pods come one or two to a workflow; hook and step pods many to a
	// pass, each within --hook-step-read-budget; step pods, the common case, from the store
	// first.
	roles: map[role]roleRule{
		roleExitHandler: {budget: budgetLive},
		roleAgent:       {budget: budgetLive},
		roleHook:        {budget: budgetHookStep},
		roleStep:        {storeFirst: true, budget: budgetHookStep},
	},
	noun: "pod", retried: "run it again",
	logs:      logsOf("pod", "pod", "completed"),
	eventType: corev1.EventTypeWarning, eventDenied: contract.EventReasonDenied, eventWarned: contract.EventReasonWarned,
	rowNotOwned: "1", rowNotWatched: "3",
	refusals: []contract.Reason{contract.ReasonWorkflowCompleted, contract.ReasonWorkflowDeleted, contract.ReasonWorkflowReplaced},
	admissions: []contract.Reason{contract.ReasonNotOwnedByWorkflow, contract.ReasonArtifactGCOrOtherComponent, contract.ReasonNamespaceNotWatched,
		contract.ReasonNotCoveredByPolicy, contract.ReasonWorkflowNotTerminal, contract.ReasonPhaseNotDenied, contract.ReasonNotSeenCompleted,
		contract.ReasonUnverifiedFailOpen, contract.ReasonUnconfirmedCompletion},
	covered: podCovered,
}

// podCovered says whether the policy judges a pod of its role: exit-handler and agent pods
// always, lifecycle-hook and step pods unless --cover leaves them out (by default it covers
// every pod a workflow owns).
func podCovered(o Options, f facts) bool {
	switch f.role {
	case roleExitHandler, roleAgent:
		return true
	case roleHook:
		return o.Cover.Hooks()
	default:
		return o.Cover.Steps()
	}
}

func (p *podObject) spec() *kindSpec { return podSpec }

// requeuedWhenRefused: the pods of a workflow's nodes, which createWorkflowPod sends (a 429 is
// transient on every line: requeueIfTransientErr leaves the node Pending and requeues the
// workflow). Not an agent pod: v3.4 makes the workflow Error on any create error.
func (p *podObject) requeuedWhenRefused() bool {
	return p.role == roleExitHandler || p.role == roleHook || p.role == roleStep
}

// comesAfterReRunNodes: an exit-handler pod; a retry's hook, step and agent pods come at once.
func (p *podObject) comesAfterReRunNodes() bool { return p.role == roleExitHandler }
func (p *podObject) logValues() []any {
	return []any{"pod", p.meta.Namespace + "/" + p.name, "podKind", p.role, "node", p.node}
}
func (p *podObject) annotate(a map[string]string) {
	if p.owned {
		a["pod-kind"] = string(p.role)
	}
}

func (p *podObject) refused() string {
	return fmt.Sprintf("%s pod %s for node %s", p.role, p.name, p.nodeText())
}

func (p *podObject) eventRefused() string {
	return fmt.Sprintf("%s pod %s (node %s) refused", p.role, p.name, p.nodeText())
}

// nodeText names what a pod runs, for messages and Events.
func (p *podObject) nodeText() string {
	switch {
	case p.role == roleAgent:
		return "(the workflow's HTTP and plugin tasks)"
	case p.node == "":
		return "(no node-name annotation)"
	}
	return p.node
}

// mark adds contract.LabelSuspect and contract.AnnotationSuspectReason, and nothing else.
func (p *podObject) mark(msg string) []jsonpatch.Operation {
	var ops []jsonpatch.Operation
	if p.meta.Labels == nil {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/labels", map[string]string{contract.LabelSuspect: "true"}))
	} else {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/labels/"+escapePointer(contract.LabelSuspect), "true"))
	}
	if p.meta.Annotations == nil {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations", map[string]string{contract.AnnotationSuspectReason: msg}))
	} else {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations/"+escapePointer(contract.AnnotationSuspectReason), msg))
	}
	return ops
}

// escapePointer escapes a map key for a JSON pointer (RFC 6901).
func escapePointer(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '~':
			b.WriteString("~0")
		case '/':
			b.WriteString("~1")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
