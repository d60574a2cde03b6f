package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// podTemplates are pods as Argo v3.4.17's controller created them (webhook/testdata), grown
// by what real templates add (env, volumes, mounts, resources) to 10 to 15 KB of JSON.
type podTemplates struct {
	exit, step corev1.Pod
}

func loadPodTemplates() (*podTemplates, error) {
	var t podTemplates
	for file, p := range map[string]*corev1.Pod{"v3.4.17-exit-handler.json": &t.exit, "v3.4.17-step.json": &t.step} {
		raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "webhook", "testdata", "argo-pods", file)) //nolint:gosec // G304: the repository's own test data
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, p); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		p.Status = corev1.PodStatus{}
		grow(p)
	}
	return &t, nil
}

// grow adds to the pod's main container what a production template carries.
func grow(p *corev1.Pod) {
	c := &p.Spec.Containers[len(p.Spec.Containers)-1]
	for i := range 60 {
		c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("APP_SETTING_%02d", i), Value: strings.Repeat("v", 48)})
	}
	c.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
	}
	for _, v := range []string{"config", "credentials", "cache", "scratch"} {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app-" + v}}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v, MountPath: "/etc/app/" + v})
	}
}

// hookPod is the pod of a lifecycle hook of wf (the step template as a `.hooks.` node), which
// the guard covers by default and reads live.
func hookPod(template *corev1.Pod, wf metav1.Object) *corev1.Pod {
	p := podFor(template, wf)
	p.Annotations[argo.AnnotationNodeName] = wf.GetName() + ".hooks.running"
	return p
}

// podFor is a copy of template for a new pod of wf, in wf's namespace, with a fresh name.
func podFor(template *corev1.Pod, wf metav1.Object) *corev1.Pod {
	p := template.DeepCopy()
	p.Namespace = wf.GetNamespace()
	p.Name = wf.GetName() + "-" + rand.String(10)
	p.ResourceVersion, p.UID = "", ""
	p.Labels[argo.LabelWorkflow] = wf.GetName()
	for i := range p.OwnerReferences {
		p.OwnerReferences[i].Name, p.OwnerReferences[i].UID = wf.GetName(), wf.GetUID()
	}
	if n := p.Annotations[argo.AnnotationNodeName]; n != "" {
		p.Annotations[argo.AnnotationNodeName] = wf.GetName() + n[strings.IndexByte(n, '.'):]
	}
	return p
}

// foreignPod is a pod no workflow owns.
func foreignPod(ns string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-" + rand.String(10), Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.invalid/web:1"}}}}
}
