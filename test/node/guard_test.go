//go:build node

package node_test

import (
	"bytes"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// helm runs the pinned helm on the node's API server.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := testenv.HelmBin()
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append(args, "--kubeconfig", kc)...) //nolint:gosec // G204: the pinned helm
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), cluster.Logs("kubelet"))
	}
	return out.String()
}

// nodeValues are the values that put the chart on this node: the image loaded into containerd
// (never pulled), and the API server's address (no kube-proxy makes the kubernetes Service's
// ClusterIP lead to it).
func nodeValues(t *testing.T) []string {
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	return []string{
		"--set", "image.registry=exit-guard.local", "--set", "image.repository=exit-guard", "--set", "image.tag=node",
		"--set", "image.pullPolicy=Never",
		"--set", "extraEnv[0].name=KUBERNETES_SERVICE_HOST", "--set", "extraEnv[0].value=" + u.Hostname(),
		"--set-string", "extraEnv[1].name=KUBERNETES_SERVICE_PORT", "--set-string", "extraEnv[1].value=" + u.Port(),
	}
}

// TestTheChartsGuardRunsOnTheNode: helm install --wait of the chart with its defaults (two
// replicas, enforce) on the real node: the guard's image runs in containers, their probes pass,
// the Deployment is available.
func TestTheChartsGuardRunsOnTheNode(t *testing.T) {
	start := time.Now()
	args := append([]string{"install", "eg", filepath.Join(testenv.RepoRoot(), "charts", "exit-guard"),
		"--namespace", "exit-guard", "--create-namespace", "--wait", "--timeout", "4m"}, nodeValues(t)...)
	helm(t, args...)
	t.Logf("helm install --wait: %s", time.Since(start).Round(time.Millisecond))
	var d appsv1.Deployment
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: "exit-guard", Name: "eg-exit-guard"}, &d); err != nil {
		t.Fatal(err)
	}
	if d.Status.AvailableReplicas != 2 {
		t.Fatalf("available replicas %d, want 2", d.Status.AvailableReplicas)
	}
	var pods corev1.PodList
	if err := env.Client.List(t.Context(), &pods, client.InNamespace("exit-guard")); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			t.Logf("pod %s (%s) on %s: container %s ready=%v started=%s image=%s", p.Name, p.Status.PodIP, p.Spec.NodeName, cs.Name, cs.Ready,
				p.Status.StartTime, cs.ImageID)
		}
	}
}
