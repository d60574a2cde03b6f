//go:build envtest

package chart

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// sidecarValues is examples/sidecar-values.yaml: what a user adds to the argo-workflows chart.
type sidecarValues struct {
	Controller struct {
		ExtraContainers []corev1.Container `json:"extraContainers"`
		Volumes         []corev1.Volume    `json:"volumes"`
	} `json:"controller"`
}

func readSidecarValues(t *testing.T) (corev1.Container, []corev1.Volume) {
	t.Helper()
	var v sidecarValues
	readExample(t, "sidecar-values.yaml", &v, func(raw []byte, v any) error { return yaml.UnmarshalStrict(raw, v) })
	if len(v.Controller.ExtraContainers) != 1 || len(v.Controller.Volumes) != 1 {
		t.Fatalf("examples/sidecar-values.yaml has %d containers and %d volumes, want 1 and 1", len(v.Controller.ExtraContainers), len(v.Controller.Volumes))
	}
	return v.Controller.ExtraContainers[0], v.Controller.Volumes
}

// TestSidecarSnippetMatchesTheChart checks the documented container against what the chart
// renders for the same release ("exit-guard" in "argo"): the same arguments (and a restart in
// the process instead of an exit), image, mounts and ports as the standalone container, the
// Secret the sidecar profile makes, and the port its Service targets; that nothing of it can
// keep Argo's controller pod from starting or being ready (an optional volume, no readiness
// probe); and that a pod with it passes the restricted Pod Security profile.
func TestSidecarSnippetMatchesTheChart(t *testing.T) {
	c, volumes := readSidecarValues(t)
	standalone := convert[appsv1.Deployment](t, only(t, render(t, profiles[0], "exit-guard", "argo"), "Deployment"))
	want := standalone.Spec.Template.Spec.Containers[0]
	// The chart's arguments, with the sidecar's own probe port (sidecar.probePort: the
	// controller's pod has 8081 taken), the controller's ServiceAccount as the expected
	// requester (the argo-workflows chart's for its release argo-workflows), and
	// --restart-on-failure.
	wantArgs := slices.Clone(want.Args)
	for i, a := range wantArgs {
		if strings.HasPrefix(a, "--health-probe-bind-address=") {
			wantArgs[i] = "--health-probe-bind-address=:8082"
		}
		if strings.HasPrefix(a, "--expected-requester=") {
			wantArgs[i] = "--expected-requester=system:serviceaccount:argo:argo-workflows-workflow-controller"
		}
	}
	if diff := cmp.Diff(append(wantArgs, "--restart-on-failure"), c.Args); diff != "" {
		t.Errorf("sidecar args differ from the chart's and --restart-on-failure (-want +docs):\n%s", diff)
	}
	for _, p := range c.Ports {
		for _, taken := range []int32{9090, 8081, 6060} {
			if p.ContainerPort == taken {
				t.Errorf("the sidecar's port %s is %d, a port of the argo-workflows chart's controller", p.Name, taken)
			}
		}
	}
	if diff := cmp.Diff(want.Env, c.Env); diff != "" {
		t.Errorf("sidecar env differs from the chart's (-chart +docs):\n%s", diff)
	}
	if diff := cmp.Diff(want.VolumeMounts, c.VolumeMounts); diff != "" {
		t.Errorf("sidecar mounts differ from the chart's (-chart +docs):\n%s", diff)
	}
	if c.Image != want.Image || c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("sidecar image %q liveness %+v, want %q and /healthz", c.Image, c.LivenessProbe, want.Image)
	}
	// A guard that is not ready must not make the controller's pod NotReady: the webhook fails
	// open while it cannot answer, and exit_guard_ready says so.
	if c.ReadinessProbe != nil || c.StartupProbe != nil {
		t.Errorf("the sidecar has a readiness or startup probe: a guard that is not ready would make Argo's controller pod NotReady")
	}
	side := render(t, profile{name: "sidecar", set: []string{"installMode=sidecar"}}, "exit-guard", "argo")
	secret := only(t, side, "Secret").GetName()
	if volumes[0].Secret == nil || volumes[0].Secret.SecretName != secret {
		t.Errorf("sidecar volume %+v, want the chart's Secret %s", volumes[0], secret)
	}
	// Uninstalling exit-guard deletes the Secret: a volume that is not optional would keep the
	// next controller pod in ContainerCreating.
	if volumes[0].Secret == nil || volumes[0].Secret.Optional == nil || !*volumes[0].Secret.Optional {
		t.Errorf("sidecar volume %+v is not optional: without exit-guard's Secret, Argo's controller pod would not start", volumes[0])
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

// sidecarArgs are the documented arguments, run in the test: the API server reaches the test
// process as localhost on the test's webhook port, not through the Service.
func sidecarArgs(c corev1.Container, ns, certDir string) []string {
	return append(append([]string{}, c.Args...),
		"--webhook-port="+strconv.Itoa(env.WebhookPort), "--webhook-cert-path="+certDir,
		"--cert-namespace="+ns, "--cert-extra-dns-names=localhost", "--shutdown-delay=0s", "--expected-requester="+testRequester)
}

// TestSidecarRunsAsTheControllersServiceAccount installs the sidecar profile, runs the guard
// with the documented arguments as the workflow-controller's ServiceAccount, and has the API
// server call it through the chart's webhook configuration, with the certificate the guard
// made.
func TestSidecarRunsAsTheControllersServiceAccount(t *testing.T) {
	c, _ := readSidecarValues(t)
	ns := newNamespace(t, nil)
	objs := render(t, profile{name: "sidecar", set: []string{"installMode=sidecar"}}, "exit-guard", ns)
	webhooks := install(t, objs)
	registerAt(t, webhooks[0], "https://localhost:"+strconv.Itoa(env.WebhookPort), nil)
	sa := "argo-workflows-workflow-controller"
	if err := env.Client.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}); err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	mountSecret(t.Context(), t, types.NamespacedName{Namespace: ns, Name: only(t, objs, "Secret").GetName()}, certDir)
	out := &testenv.Output{}
	g, err := testenv.StartGuard(t.Context(), guardBin, kubeconfigAs(t, ns, sa), sidecarArgs(c, ns, certDir), out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	defer func() { _ = g.Stop() }()

	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	err = env.Client.Create(t.Context(), fixture.ExitPod(done))
	if !contract.IsRefusal(err) {
		t.Fatalf("stale exit-handler pod: err = %v, want refused\n%s", err, out)
	}
	waitDeniedEvent(t, done)
	if strings.Contains(strings.ToLower(out.String()), "forbidden") {
		t.Errorf("the sidecar hit a permission it lacks:\n%s", out)
	}
}

// TestSidecarOutlivesUninstallAndFailures: the sidecar keeps running, and answers its
// liveness probe, whatever happens to exit-guard around it, so that Argo's controller pod
// keeps starting and stays Ready (the snippet has no readiness probe; see above). First with
// exit-guard uninstalled (no RBAC, no Secret, the empty folder the kubelet mounts for a missing
// optional Secret): the guard fails and restarts in its process, alive and not ready. Then
// with exit-guard installed but its Secret lost: it fails the same way until the Secret is
// back, and then guards.
func TestSidecarOutlivesUninstallAndFailures(t *testing.T) {
	c, _ := readSidecarValues(t)
	ns := newNamespace(t, nil)
	sa := "argo-workflows-workflow-controller"
	if err := env.Client.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}); err != nil {
		t.Fatal(err)
	}
	objs := render(t, profile{name: "sidecar", set: []string{"installMode=sidecar"}}, "exit-guard", ns)
	secret := only(t, objs, "Secret")

	// alive fails the test unless the process runs and its liveness probe passes, and returns
	// the readiness probe's status code.
	alive := func(t *testing.T, g *testenv.Guard, out *testenv.Output) int {
		t.Helper()
		if err := g.Exited(); err != nil {
			t.Fatalf("the sidecar exited (%v): the controller pod would go NotReady, then CrashLoopBackOff\n%s", err, out)
		}
		if code, err := g.Probe(t.Context(), "/healthz"); err != nil || code != http.StatusOK {
			t.Fatalf("liveness probe: %d, %v, want 200: the kubelet would restart the container\n%s", code, err, out)
		}
		code, err := g.Probe(t.Context(), "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	// logged waits until the output holds n lines with text.
	logged := func(t *testing.T, g *testenv.Guard, out *testenv.Output, text string, n int) {
		t.Helper()
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
			if err := g.Exited(); err != nil {
				return false, fmt.Errorf("the sidecar exited (%w): the controller pod would go NotReady, then CrashLoopBackOff", err)
			}
			return strings.Count(out.String(), text) >= n, nil
		})
		if err != nil {
			t.Fatalf("the guard did not log %q %d times: %v\n%s", text, n, err, out)
		}
	}

	t.Run("uninstalled", func(t *testing.T) {
		out := &testenv.Output{}
		g, err := testenv.LaunchGuard(guardBin, kubeconfigAs(t, ns, sa), sidecarArgs(c, ns, t.TempDir()), out)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = g.Kill() }()
		// Its requests are refused again and again (the informers back off: 10 s or so).
		logged(t, g, out, "forbidden", 4)
		if code := alive(t, g, out); code == http.StatusOK {
			t.Errorf("readiness probe 200 with no certificate and no permissions")
		}
	})

	t.Run("secret lost, then back", func(t *testing.T) {
		webhooks := install(t, objs)
		registerAt(t, webhooks[0], "https://localhost:"+strconv.Itoa(env.WebhookPort), nil)
		if err := env.Client.Delete(t.Context(), secret.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		certDir := t.TempDir()
		mountSecret(t.Context(), t, types.NamespacedName{Namespace: ns, Name: secret.GetName()}, certDir)
		out := &testenv.Output{}
		g, err := testenv.LaunchGuard(guardBin, kubeconfigAs(t, ns, sa), sidecarArgs(c, ns, certDir), out)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = g.Stop() }()
		logged(t, g, out, "restarting", 2)
		if code := alive(t, g, out); code == http.StatusOK {
			t.Errorf("readiness probe 200 without its certificate Secret")
		}
		s := secret.DeepCopy()
		s.SetResourceVersion("")
		if err := env.Client.Create(t.Context(), s); err != nil {
			t.Fatal(err)
		}
		if err := g.WaitReady(t.Context(), 2*time.Minute); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		done := createWorkflow(t, ns, argo.PhaseSucceeded)
		if err := env.Client.Create(t.Context(), fixture.ExitPod(done)); !contract.IsRefusal(err) {
			t.Fatalf("stale exit-handler pod after the recovery: err = %v, want refused\n%s", err, out)
		}
		mfs, err := g.Metrics(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if mf := mfs["exit_guard_restarts_total"]; mf == nil || mf.GetMetric()[0].GetCounter().GetValue() < 2 {
			t.Errorf("exit_guard_restarts_total = %v, want at least 2", mf)
		}
	})
}
