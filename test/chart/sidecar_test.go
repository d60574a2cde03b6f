package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/internal/testenv"
)

// sidecarValues is docs/sidecar-values.yaml: what a user adds to the argo-workflows chart.
type sidecarValues struct {
	Controller struct {
		ExtraContainers []corev1.Container `json:"extraContainers"`
		Volumes         []corev1.Volume    `json:"volumes"`
	} `json:"controller"`
}

func readSidecarValues(t *testing.T) (corev1.Container, []corev1.Volume) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "sidecar-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v sidecarValues
	if err := yaml.UnmarshalStrict(raw, &v); err != nil {
		t.Fatalf("docs/sidecar-values.yaml: %v", err)
	}
	if len(v.Controller.ExtraContainers) != 1 || len(v.Controller.Volumes) != 1 {
		t.Fatalf("docs/sidecar-values.yaml has %d containers and %d volumes, want 1 and 1", len(v.Controller.ExtraContainers), len(v.Controller.Volumes))
	}
	return v.Controller.ExtraContainers[0], v.Controller.Volumes
}

// TestSidecarSnippetMatchesTheChart checks the documented container against what the chart
// renders for the same release ("exit-guard" in "argo"): the same arguments, image, mounts and
// ports as the standalone container, the Secret the sidecar profile makes, and the port its
// Service targets; and that a pod with it passes the restricted Pod Security profile.
func TestSidecarSnippetMatchesTheChart(t *testing.T) {
	c, volumes := readSidecarValues(t)
	standalone := convert[appsv1.Deployment](t, only(t, render(t, profiles[0], "exit-guard", "argo"), "Deployment"))
	want := standalone.Spec.Template.Spec.Containers[0]
	if diff := cmp.Diff(want.Args, c.Args); diff != "" {
		t.Errorf("sidecar args differ from the chart's (-chart +docs):\n%s", diff)
	}
	if diff := cmp.Diff(want.Env, c.Env); diff != "" {
		t.Errorf("sidecar env differs from the chart's (-chart +docs):\n%s", diff)
	}
	if diff := cmp.Diff(want.VolumeMounts, c.VolumeMounts); diff != "" {
		t.Errorf("sidecar mounts differ from the chart's (-chart +docs):\n%s", diff)
	}
	if c.Image != want.Image || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("sidecar image %q readiness %q, want %q and /readyz", c.Image, c.ReadinessProbe.HTTPGet.Path, want.Image)
	}
	side := render(t, profile{name: "sidecar", set: []string{"installMode=sidecar"}}, "exit-guard", "argo")
	secret := only(t, side, "Secret").GetName()
	if volumes[0].Secret == nil || volumes[0].Secret.SecretName != secret {
		t.Errorf("sidecar volume %+v, want the chart's Secret %s", volumes[0], secret)
	}
	svc := convert[corev1.Service](t, only(t, side, "Service"))
	var webhookPort int32
	for _, p := range c.Ports {
		if p.Name == "webhook" {
			webhookPort = p.ContainerPort
		}
	}
	if svc.Spec.Ports[0].TargetPort.IntVal != webhookPort {
		t.Errorf("the Service targets port %v, the sidecar serves on %d", svc.Spec.Ports[0].TargetPort, webhookPort)
	}

	ns := newNamespace(t, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "workflow-controller"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{c}, Volumes: volumes}}
	if err := env.Client.Create(t.Context(), pod, client.DryRunAll); err != nil {
		t.Errorf("a pod with the sidecar is refused: %v", err)
	}
}

// TestSidecarRunsAsTheControllersServiceAccount installs the sidecar profile, runs the guard
// with the documented arguments as the workflow-controller's ServiceAccount, and has the API
// server call it through the chart's webhook configuration.
func TestSidecarRunsAsTheControllersServiceAccount(t *testing.T) {
	c, _ := readSidecarValues(t)
	ns := newNamespace(t, nil)
	objs := render(t, profile{name: "sidecar", set: []string{"installMode=sidecar"}}, "exit-guard", ns)
	webhooks := install(t, objs)
	sa := "argo-workflows-workflow-controller"
	if err := env.Client.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}); err != nil {
		t.Fatal(err)
	}
	out := &testenv.Output{}
	args := append(append([]string{}, c.Args...),
		"--webhook-port="+strconv.Itoa(env.WebhookPort), "--webhook-cert-path="+env.WebhookCertDir, "--shutdown-delay=0s")
	g, err := testenv.StartGuard(t.Context(), guardBin, kubeconfigAs(t, ns, sa), args, out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	defer func() { _ = g.Stop() }()
	registerAt(t, webhooks[0], fmt.Sprintf("https://%s:%d", env.WebhookHost, env.WebhookPort), env.WebhookCAData)

	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	err = env.Client.Create(t.Context(), testenv.ExitPod(done))
	if !apierrors.IsForbidden(err) {
		t.Fatalf("stale exit-handler pod: err = %v, want refused\n%s", err, out)
	}
	waitDeniedEvent(t, done)
	if strings.Contains(strings.ToLower(out.String()), "forbidden") {
		t.Errorf("the sidecar hit a permission it lacks:\n%s", out)
	}
}
