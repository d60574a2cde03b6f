//go:build envtest

package chart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// runCheck runs the `helm test` pod's command, `exit-guard <args>`, as the test's own
// ServiceAccount, and returns its exit status and output.
func runCheck(t *testing.T, ns, sa string, args []string) (int, string) {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, kubeconfigAs(t, ns, sa), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), guardBin, args...) //nolint:gosec // G204: the binary this repository built
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kc)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), out.String()
	case err != nil:
		t.Fatal(err)
	}
	return 0, out.String()
}

// TestCheckProvesTheInstall runs the chart's `helm test` command, with its ServiceAccount and
// nothing more, against an install: it passes when the API server calls the guard and the
// guard refuses the dry-run exit-handler pod as workflow-deleted, in enforce and in warn mode;
// it fails, saying why, when the webhook configuration is missing (the API server never asks
// the guard) and when the guard is down (the API server fails open). It leaves nothing behind.
func TestCheckProvesTheInstall(t *testing.T) {
	for _, mode := range []string{"enforce", "warn"} {
		t.Run(mode, func(t *testing.T) {
			ns := newNamespace(t, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
			p := profile{name: mode, set: append([]string{"guard.mode=" + mode}, chartCerts.set...)}
			objs := render(t, p, "chk", ns)
			webhooks := install(t, objs)
			pod := onlyTestHook(t, objs, "Pod")
			sa := onlyTestHook(t, objs, "ServiceAccount").GetName()
			c := convert[corev1.Pod](t, pod).Spec.Containers[0]
			if want := []string{"check", "--namespace=" + ns}; !slices.Equal(c.Args[:2], want) || c.Command != nil {
				t.Fatalf("the test pod runs %v %v, want the image's entrypoint with %v", c.Command, c.Args, want)
			}

			code, out := runCheck(t, ns, sa, c.Args)
			if code == 0 || !strings.Contains(out, "did not reach the guard") {
				t.Errorf("with no webhook configuration: exit %d, want a failure that says the guard was not reached:\n%s", code, out)
			}

			g, gout := startChartGuard(t, ns, objs)
			for _, wh := range webhooks {
				registerAt(t, wh, fmt.Sprintf("https://%s:%d", env.WebhookHost, env.WebhookPort), env.WebhookCAData)
			}
			code, out = runCheck(t, ns, sa, c.Args)
			want := map[string]string{"enforce": "which denied (workflow-deleted)", "warn": "which marked"}[mode]
			if code != 0 || !strings.Contains(out, "exit-guard check: OK") || !strings.Contains(out, want) {
				t.Errorf("exit %d, want 0 and %q:\n%s\nguard:\n%s", code, want, out, gout)
			}

			if err := g.Stop(); err != nil {
				t.Logf("stopping the guard: %v", err)
			}
			code, out = runCheck(t, ns, sa, c.Args)
			if code == 0 {
				t.Errorf("with the guard down: exit 0, want a failure:\n%s", out)
			}

			var pods corev1.PodList
			if err := env.Client.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			if len(pods.Items) != 0 {
				t.Errorf("the check left %d pods behind", len(pods.Items))
			}
		})
	}
}
