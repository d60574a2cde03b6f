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
	tests := []struct {
		name      string
		meta      metav1.ObjectMeta
		wantRole  role
		wantOwned bool
	}{
		{"the on-exit label marks an exit handler", metav1.ObjectMeta{Labels: map[string]string{argo.LabelOnExit: "true"}, OwnerReferences: owner}, roleExitHandler, true},
		{"the label counts whatever its value", metav1.ObjectMeta{Labels: map[string]string{argo.LabelOnExit: "false"}, OwnerReferences: owner}, roleExitHandler, true},
		{"an onExit node name alone marks an exit handler", metav1.ObjectMeta{Annotations: map[string]string{argo.AnnotationNodeName: "wf[0].step-1.onExit"}, OwnerReferences: owner}, roleExitHandler, true},
		{"a hooks node is a lifecycle hook", metav1.ObjectMeta{Annotations: map[string]string{argo.AnnotationNodeName: "wf.hooks.running"}, OwnerReferences: owner}, roleHook, true},
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
