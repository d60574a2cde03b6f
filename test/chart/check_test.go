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
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// runCheck runs the `helm test` pod's command, `exit-guard <args>`, as the test's own
// ServiceAccount, and returns its exit status and output.
func runCheck(t *testing.T, ns, sa string, args []string) (int, string) {
	t.Helper()
	code, out, err := checkCommand(t, ns, sa, args)()
	if err != nil {
		t.Fatal(err)
	}
	return code, out
}

// checkCommand prepares runCheck's command; the function it returns runs it (from any
// goroutine) and returns its exit status and output, or an error when it could not run.
func checkCommand(t *testing.T, ns, sa string, args []string) func() (int, string, error) {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, kubeconfigAs(t, ns, sa), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), guardBin, args...) //nolint:gosec // G204: the binary this repository built
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kc)
	return func() (int, string, error) {
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			return exit.ExitCode(), out.String(), nil
		case err != nil:
			return 0, "", err
		}
		return 0, out.String(), nil
	}
}

// TestCheckProvesTheInstall runs the chart's `helm test` command, with its ServiceAccount and
// nothing more, against an install: it passes when the API server calls the guard and the
// guard refuses the dry-run exit-handler pod as workflow-deleted, in enforce and in warn mode,
// waiting for the guard when it starts before the webhook is served; it fails, saying why, when
// the webhook configuration is missing (the API server never asks the guard) and when the guard
// is down (the API server fails open). It leaves nothing behind, and it leaves every alert of
// the chart silent and every decision panel of its dashboard where it was: the check's dry run
// is counted apart (exit_guard_dry_run_decisions_total).
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
			short := append(slices.Clone(c.Args), "--timeout=3s")

			code, out := runCheck(t, ns, sa, short)
			if code == 0 || !strings.Contains(out, "did not reach the guard") || !strings.Contains(out, "no answer from the guard in") {
				t.Errorf("with no webhook configuration: exit %d, want a failure that says the guard was not reached:\n%s", code, out)
			}

			// The check started before the webhook is served waits for it.
			type result struct {
				code int
				out  string
				err  error
			}
			waited := make(chan result, 1)
			run := checkCommand(t, ns, sa, c.Args)
			go func() {
				code, out, err := run()
				waited <- result{code, out, err}
			}()
			g, gout := startChartGuard(t, ns, objs)
			// A cluster where workflows run: the guard's watch has advanced (a watch that never
			// has is ExitGuardWatchStalled's, with or without the check).
			running := createWorkflow(t, ns, argo.PhaseRunning)
			if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				mfs, err := g.Metrics(ctx)
				return err == nil && testenv.SumSeries(mfs, "exit_guard_watch_last_progress_timestamp_seconds", nil) > 0, nil
			}); err != nil {
				t.Fatalf("the guard's watch never advanced: %v", err)
			}
			before := scrapeBoth(t, g)
			for _, wh := range webhooks {
				registerAt(t, wh, fmt.Sprintf("https://%s:%d", env.WebhookHost, env.WebhookPort), env.WebhookCAData)
			}
			r := <-waited
			if r.err != nil {
				t.Fatal(r.err)
			}
			want := map[string]string{"enforce": "which denied (workflow-deleted)", "warn": "which marked"}[mode]
			if r.code != 0 || !strings.Contains(r.out, "exit-guard check: OK") || !strings.Contains(r.out, want) {
				t.Errorf("exit %d, want 0 and %q:\n%s\nguard:\n%s", r.code, want, r.out, gout)
			}
			after := scrapeBoth(t, g)
			if got := testenv.SumSeries(after.guard, "exit_guard_dry_run_decisions_total", nil) - testenv.SumSeries(before.guard, "exit_guard_dry_run_decisions_total", nil); got != 1 {
				t.Errorf("exit_guard_dry_run_decisions_total moved by %v, want 1 (the check's one dry run that reached the guard); the counters that moved:\n%s", got, moved(before, after, ns))
			}
			checkAlertsSilent(t, "chk", ns, before, after)
			checkPanelsUnmoved(t, ns, before, after)
			if !strings.Contains(r.out, "has judged no pod of Argo's yet") {
				t.Errorf("before any pod of Argo's, the check does not say the guard cannot tell Argo's release:\n%s", r.out)
			}
			// Once the guard judged a pod of Argo's, the check says which release made it and
			// what the README's table says of it.
			step := fixture.StepPod(running)
			step.Spec.Containers = append(step.Spec.Containers, corev1.Container{Name: "wait", Image: "quay.io/argoproj/argoexec:v3.5.14"})
			// The namespace enforces the restricted profile, which is checked before the guard.
			step.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
			for i := range step.Spec.Containers {
				step.Spec.Containers[i].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
			}
			// Created for real, as the controller (the expected requester, env.Client's user)
			// sends it: a dry run says nothing of Argo's release.
			if err := env.Client.Create(t.Context(), step); err != nil {
				t.Fatalf("the step pod of a running workflow: %v", err)
			}
			if code, out := runCheck(t, ns, sa, c.Args); code != 0 || !strings.Contains(out, "exit-guard: Argo Workflows v3.5.14 seen on the pods it judges: exposed") {
				t.Errorf("after a pod of Argo v3.5.14: exit %d, want 0 and the release said exposed:\n%s", code, out)
			}
			if err := env.Client.Delete(t.Context(), step); err != nil {
				t.Fatalf("deleting the step pod: %v", err)
			}

			if err := g.Stop(); err != nil {
				t.Logf("stopping the guard: %v", err)
			}
			code, out = runCheck(t, ns, sa, short)
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

// scrapeBoth reads the guard's metrics and the API server's.
func scrapeBoth(t *testing.T, g *testenv.Guard) scrape {
	t.Helper()
	guard, err := g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	apiserver, err := env.APIServerMetrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return scrape{guard: guard, apiserver: apiserver, at: time.Now()}
}

// TestTheCheckRunsAfterSync: with check.afterSync the chart renders the check as a Job that
// Helm runs after install and upgrade and Argo CD after every sync (PostSync), with RBAC that
// exists before it (an earlier wave and weight). Its command, run as its own ServiceAccount
// with that RBAC alone, proves the install as helm test's does.
func TestTheCheckRunsAfterSync(t *testing.T) {
	ns := newNamespace(t, nil)
	objs := render(t, profile{name: "after-sync", set: append([]string{"check.afterSync=true"}, chartCerts.set...)}, "sync", ns)
	var job *batchv1.Job
	var sa string
	for _, o := range objs {
		a := o.GetAnnotations()
		if a["argocd.argoproj.io/hook"] != "PostSync" {
			continue
		}
		if a["helm.sh/hook"] != "post-install,post-upgrade" {
			t.Errorf("%s %s: Argo CD's PostSync without Helm's post-install,post-upgrade: %v", o.GetKind(), o.GetName(), a)
		}
		switch o.GetKind() {
		case "Job":
			job = convert[batchv1.Job](t, o)
		case "ServiceAccount":
			sa = o.GetName()
			fallthrough
		default:
			if a["argocd.argoproj.io/sync-wave"] != "-1" || a["helm.sh/hook-weight"] != "-1" {
				t.Errorf("%s %s is not created before the Job: %v", o.GetKind(), o.GetName(), a)
			}
		}
	}
	if job == nil || sa == "" || job.Spec.Template.Spec.ServiceAccountName != sa {
		t.Fatalf("no PostSync Job run as its own ServiceAccount (job %v, ServiceAccount %q)", job, sa)
	}
	webhooks := install(t, objs)
	startChartGuard(t, ns, objs)
	for _, wh := range webhooks {
		registerAt(t, wh, fmt.Sprintf("https://%s:%d", env.WebhookHost, env.WebhookPort), env.WebhookCAData)
	}
	if code, out := runCheck(t, ns, sa, job.Spec.Template.Spec.Containers[0].Args); code != 0 || !strings.Contains(out, "exit-guard check: OK") {
		t.Errorf("the Job's check: exit %d, want 0 and OK:\n%s", code, out)
	}
	if none := render(t, chartCerts, "sync", ns); slices.ContainsFunc(none, func(o *unstructured.Unstructured) bool { return o.GetKind() == "Job" }) {
		t.Error("the Job is rendered without check.afterSync")
	}
}
