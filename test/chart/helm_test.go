//go:build envtest

package chart

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// guardWrote is what the guard writes into objects Helm owns, in certificate mode self: the
// Secret's data and the webhook configurations' caBundles.
type guardWrote struct {
	secret    map[string][]byte
	caBundles [][]byte
}

// TestHelmUpgradeKeepsWhatTheGuardWrote installs the chart into the real API server with its
// defaults, runs the guard as the chart's Deployment would, which fills the Secret and the
// caBundles that the chart renders empty, and upgrades twice with the pinned Helm: with a
// changed value, and with --reset-then-reuse-values. Neither may take back what the guard
// wrote, conflict with it, or stop the guard refusing a stale exit handler through the
// rendered Service. Then helm uninstall leaves none of the release's objects. Installed by the
// pinned Helm (Helm 4: server-side apply); TestAHelm3ReleaseUpgradesUnderHelm4 (make compat)
// installs with Helm 3.
func TestHelmUpgradeKeepsWhatTheGuardWrote(t *testing.T) {
	helmUpgradeKeepsWhatTheGuardWrote(t, helm(t))
}

// helmUpgradeKeepsWhatTheGuardWrote is the test with the release installed by the helm binary
// installer, and upgraded and uninstalled by the pinned one.
func helmUpgradeKeepsWhatTheGuardWrote(t *testing.T, installer string) {
	const release = "hg"
	ns := newNamespace(t, nil)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	h := func(args ...string) string {
		t.Helper()
		return string(runHelm(t, append(args, "--kubeconfig", kc, "--namespace", ns)...))
	}
	major := strings.SplitN(strings.TrimSpace(string(runHelmBin(t, installer, "version", "--template", "{{.Version}}"))), ".", 2)[0]
	runHelmBin(t, installer, "install", release, chartDir, "--kubeconfig", kc, "--namespace", ns)
	installed := true
	t.Cleanup(func() {
		if installed {
			h("uninstall", release)
		}
	})

	objs := render(t, profile{name: "defaults"}, release, ns)
	secret := types.NamespacedName{Namespace: ns, Name: only(t, objs, "Secret").GetName()}
	ctx, stopGuard := context.WithCancel(t.Context())
	defer stopGuard()
	certDir := t.TempDir()
	mountSecret(ctx, t, secret, certDir)
	_, g, out := serveThroughService(ctx, t, objs, certDir, "--cert-namespace="+ns)

	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	refuses := func(when string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			return contract.IsRefusal(env.Client.Create(ctx, fixture.ExitPod(done), client.DryRunAll)), nil
		})
		if err != nil {
			t.Fatalf("%s: the guard never refused the stale exit handler through the Service: %v\nthe guard said:\n%s", when, err, out)
		}
	}
	refuses("after helm install")
	state := func() guardWrote {
		t.Helper()
		var s corev1.Secret
		if err := env.Client.Get(t.Context(), secret, &s); err != nil {
			t.Fatal(err)
		}
		w := guardWrote{secret: s.Data}
		var vwcs admissionregistrationv1.ValidatingWebhookConfigurationList
		if err := env.Client.List(t.Context(), &vwcs, client.MatchingLabels{"app.kubernetes.io/instance": release}); err != nil {
			t.Fatal(err)
		}
		for _, c := range vwcs.Items {
			for _, wh := range c.Webhooks {
				w.caBundles = append(w.caBundles, wh.ClientConfig.CABundle)
			}
		}
		return w
	}
	wrote := state()
	if len(wrote.secret["ca.crt"]) == 0 || len(wrote.caBundles) == 0 {
		t.Fatalf("the guard wrote no CA (Secret keys %d, caBundles %d)", len(wrote.secret), len(wrote.caBundles))
	}
	for _, ca := range wrote.caBundles {
		if !bytes.Equal(ca, wrote.secret["ca.crt"]) {
			t.Fatal("a caBundle is not the Secret's CA")
		}
	}
	if major == "v4" {
		// Helm 4 applies server-side what it installs: its field manager owns the
		// configuration by Apply.
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		if err := env.Client.Get(t.Context(), types.NamespacedName{Name: release + "-exit-guard"}, &vwc); err != nil {
			t.Fatal(err)
		}
		applied := false
		for _, m := range vwc.ManagedFields {
			applied = applied || (strings.HasPrefix(m.Manager, "helm") && m.Operation == metav1.ManagedFieldsOperationApply)
		}
		if !applied {
			t.Fatalf("Helm %s did not apply server-side: managers %v", major, vwc.ManagedFields)
		}
	}

	for _, up := range []struct {
		name string
		args []string
		// level is the --zap-log-level the Deployment must have after it.
		level string
	}{
		{"a changed value", []string{"--set", "logging.level=debug"}, "debug"},
		{"--reset-then-reuse-values", []string{"--reset-then-reuse-values"}, "debug"},
	} {
		h(append([]string{"upgrade", release, chartDir}, up.args...)...)
		if diff := cmp.Diff(wrote, state(), cmp.AllowUnexported(guardWrote{})); diff != "" {
			t.Errorf("helm upgrade (%s) changed what the guard wrote (-before +after):\n%s", up.name, diff)
		}
		var dep appsv1.Deployment
		if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: release + "-exit-guard"}, &dep); err != nil {
			t.Fatal(err)
		}
		if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--zap-log-level="+up.level) {
			t.Errorf("helm upgrade (%s) did not apply: the Deployment's args %s", up.name, args)
		}
		refuses("after helm upgrade (" + up.name + ")")
	}

	// Uninstall: the guard's pods go with the Deployment, then nothing of the release is left.
	_ = g.Stop()
	h("uninstall", release)
	installed = false
	for _, o := range objs {
		if o.GetKind() == "Pod" || o.GetKind() == "Job" { // helm test's hook: never run here
			continue
		}
		live := o.DeepCopy()
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(o), live); !apierrors.IsNotFound(err) {
			t.Errorf("after helm uninstall, %s %s is still there (%v)", o.GetKind(), o.GetName(), err)
		}
	}
}
