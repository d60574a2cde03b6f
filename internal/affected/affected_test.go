package affected

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func deployment(image string, env ...corev1.EnvVar) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "argo", Name: "workflow-controller"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			ServiceAccountName: "argo",
			Containers: []corev1.Container{
				{Name: "log-shipper", Image: "example/shipper:1"},
				{Name: "workflow-controller", Image: image, Command: []string{"workflow-controller"}, Env: env},
			},
		}}},
	}
}

func env(name, value string) corev1.EnvVar { return corev1.EnvVar{Name: name, Value: value} }

// TestJudge holds each shape of controller to the README's Am I affected? table and #16034.
func TestJudge(t *testing.T) {
	recreate := func(d *appsv1.Deployment) *appsv1.Deployment {
		d.Spec.Strategy.Type = appsv1.RecreateDeploymentStrategyType
		return d
	}
	two := func(d *appsv1.Deployment) *appsv1.Deployment {
		n := int32(2)
		d.Spec.Replicas = &n
		return recreate(d)
	}
	for _, tc := range []struct {
		name string
		d    *appsv1.Deployment
		want Verdict
		fix  string
	}{
		{"3.4", deployment("quay.io/argoproj/workflow-controller:v3.4.17"), Affected, "v3.7.16 or v4.0.7"},
		{"3.6", deployment("quay.io/argoproj/workflow-controller:v3.6.18"), Affected, "v3.7.16 or v4.0.7"},
		{"3.7.15", deployment("quay.io/argoproj/workflow-controller:v3.7.15"), Affected, "v3.7.16"},
		{"3.7.16", deployment("quay.io/argoproj/workflow-controller:v3.7.16"), NotAffected, ""},
		{"3.3", deployment("quay.io/argoproj/workflow-controller:v3.3.10"), Affected, "v3.7.16 or v4.0.7"},
		{"4.0.5 default", deployment("quay.io/argoproj/workflow-controller:v4.0.5"), NotAffected, ""},
		{"4.0.5 write-back false", deployment("quay.io/argoproj/workflow-controller:v4.0.5", env("INFORMER_WRITE_BACK", "false")), NotAffected, ""},
		{"4.0.5 write-back", deployment("quay.io/argoproj/workflow-controller:v4.0.5", env("INFORMER_WRITE_BACK", "true")), Affected, "v4.0.7"},
		{"4.0.5 write-back 1", deployment("quay.io/argoproj/workflow-controller:v4.0.5", env("INFORMER_WRITE_BACK", "1")), Affected, "v4.0.7"},
		{"4.0.5 write-back from a ConfigMap", deployment("quay.io/argoproj/workflow-controller:v4.0.5",
			corev1.EnvVar{Name: "INFORMER_WRITE_BACK", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{Key: "k"}}}), CannotTell, "v4.0.7"},
		{"4.0.7 write-back", deployment("quay.io/argoproj/workflow-controller:v4.0.7", env("INFORMER_WRITE_BACK", "true")), NotAffected, ""},
		{"latest", deployment("quay.io/argoproj/workflow-controller:latest"), CannotTell, "Am I affected?"},
		{"digest", deployment("quay.io/argoproj/workflow-controller@sha256:0123"), CannotTell, "Am I affected?"},
		{"4.0.7 no leader election, rolling", deployment("quay.io/argoproj/workflow-controller:v4.0.7", env("LEADER_ELECTION_DISABLE", "true")), Affected, "Recreate"},
		{"4.0.7 no leader election, recreate", recreate(deployment("quay.io/argoproj/workflow-controller:v4.0.7", env("LEADER_ELECTION_DISABLE", "true"))), NotAffected, ""},
		{"4.0.7 no leader election, two replicas", two(deployment("quay.io/argoproj/workflow-controller:v4.0.7", env("LEADER_ELECTION_DISABLE", "true"))), Affected, "leader election"},
		{"4.0.7 leader election on, rolling", deployment("quay.io/argoproj/workflow-controller:v4.0.7", env("LEADER_ELECTION_DISABLE", "false")), NotAffected, ""},
		{"latest, no leader election, rolling", deployment("example/workflow-controller:latest", env("LEADER_ELECTION_DISABLE", "true")), Affected, "Recreate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Judge(Read(tc.d))
			if f.Verdict != tc.want {
				t.Errorf("verdict %s, want %s: %q", f.Verdict, tc.want, f.Why)
			}
			if len(f.Why) == 0 {
				t.Error("no reason given")
			}
			if fix := strings.Join(f.Fix, "; "); !strings.Contains(fix, tc.fix) || tc.fix == "" && fix != "" {
				t.Errorf("fix %q, want one naming %q", fix, tc.fix)
			}
		})
	}
}

// TestReadTakesTheControllersContainer: the release is the workflow-controller container's,
// found by its command or image, never a sidecar's; the executor image's tag stands in for a
// controller image without one.
func TestReadTakesTheControllersContainer(t *testing.T) {
	d := deployment("registry.example.com/mirror/workflow-controller@sha256:0123")
	d.Spec.Template.Spec.Containers[1].Command = nil
	d.Spec.Template.Spec.Containers[1].Args = []string{"--configmap", "cm", "--executor-image", "registry.example.com/mirror/argoexec:v3.6.18"}
	d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, corev1.Container{Name: "exit-guard", Image: "ghcr.io/exit-guard/exit-guard:v4.9.9"})
	c := Read(d)
	if c.Version != "v3.6.18" || c.Image != "registry.example.com/mirror/workflow-controller@sha256:0123" {
		t.Errorf("read %q from %q, want v3.6.18 from the controller's container", c.Version, c.Image)
	}
	if got := c.Requester(); got != "system:serviceaccount:argo:argo" {
		t.Errorf("requester %s", got)
	}
	d.Spec.Template.Spec.ServiceAccountName = ""
	if got := Read(d).Requester(); got != "system:serviceaccount:argo:default" {
		t.Errorf("requester without a ServiceAccount %s, want the namespace's default", got)
	}
}

func TestCode(t *testing.T) {
	for _, tc := range []struct {
		verdicts []Verdict
		want     int
	}{
		{nil, ExitCannotTell},
		{[]Verdict{NotAffected}, ExitNotAffected},
		{[]Verdict{NotAffected, CannotTell}, ExitCannotTell},
		{[]Verdict{CannotTell, Affected, NotAffected}, ExitAffected},
	} {
		var fs []Finding
		for _, v := range tc.verdicts {
			fs = append(fs, Finding{Verdict: v})
		}
		if got := Code(fs); got != tc.want {
			t.Errorf("Code(%v) = %d, want %d", tc.verdicts, got, tc.want)
		}
	}
}
