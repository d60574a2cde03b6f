package webhook

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/exit-guard/exit-guard/internal/argo"
)

func TestClassify(t *testing.T) {
	owner := []metav1.OwnerReference{{APIVersion: "argoproj.io/v1alpha1", Kind: "Workflow", Name: "wf", UID: types.UID("u"), Controller: ptr.To(true)}}
	// node is the metadata of the pod of node in workflow, which owns it.
	node := func(node, workflow string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Annotations: map[string]string{argo.AnnotationNodeName: node}, Labels: map[string]string{argo.LabelWorkflow: workflow},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "argoproj.io/v1alpha1", Kind: "Workflow", Name: workflow, UID: types.UID("u"), Controller: ptr.To(true)}}}
	}
	tests := []struct {
		name      string
		meta      metav1.ObjectMeta
		wantRole  role
		wantOwned bool
	}{
		{"the on-exit label marks an exit handler", metav1.ObjectMeta{Labels: map[string]string{argo.LabelOnExit: "true"}, OwnerReferences: owner}, roleExitHandler, true},
		{"the label counts whatever its value", metav1.ObjectMeta{Labels: map[string]string{argo.LabelOnExit: "false"}, OwnerReferences: owner}, roleExitHandler, true},
		{"an onExit node name without Argo's label is not an exit handler", node("wf[0].step-1.onExit", "wf"), roleStep, true},
		{"a DAG task named onExitCleanup is a step", node("wf.onExitCleanup", "wf"), roleStep, true},
		{"a step named onExit-notify is a step", node("wf[0].onExit-notify", "wf"), roleStep, true},
		{"a withItems fan-out of onExit-notify is a step", node("wf[0].onExit-notify(3:c)", "wf"), roleStep, true},
		{"a hooks node is a lifecycle hook", node("wf.hooks.running", "wf"), roleHook, true},
		{"a step's hook is a lifecycle hook", node("wf[0].step-1.hooks.running", "wf"), roleHook, true},
		{"a step under a hook is a lifecycle hook's", node("wf.hooks.running[0].notify", "wf"), roleHook, true},
		{"a step of a workflow named etl.hooks.daily is a step", node("etl.hooks.daily[0].load", "etl.hooks.daily"), roleStep, true},
		{"the one-pod workflow etl.hooks.daily is a step", node("etl.hooks.daily", "etl.hooks.daily"), roleStep, true},
		{"a hook of a workflow named etl.hooks.daily is a hook", node("etl.hooks.daily.hooks.running", "etl.hooks.daily"), roleHook, true},
		{"a node name that is not under the owner's name is a step", node("other.hooks.running", "wf"), roleStep, true},
		{"the agent label marks the agent", metav1.ObjectMeta{Labels: map[string]string{argo.LabelComponent: argo.ComponentAgent}, OwnerReferences: owner}, roleAgent, true},
		{"anything else is a step", metav1.ObjectMeta{Annotations: map[string]string{argo.AnnotationNodeName: "wf[0].a"}, OwnerReferences: owner}, roleStep, true},
		{"a Workflow of another group is not Argo's", metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Workflow", Name: "wf", Controller: ptr.To(true)}}}, roleStep, false},
		{"a non-controller owner reference does not count", metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{APIVersion: "argoproj.io/v1alpha1", Kind: "Workflow", Name: "wf"}}}, roleStep, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := classify(&tt.meta)
			if f.role != tt.wantRole || (f.owner != nil) != tt.wantOwned {
				t.Errorf("classify = role %s owned %v, want %s %v", f.role, f.owner != nil, tt.wantRole, tt.wantOwned)
			}
		})
	}
}
