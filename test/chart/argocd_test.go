//go:build envtest && e2e

package chart

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/go-containerregistry/pkg/registry"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

const argoCDNamespace = "argocd"

var applicationGVK = schema.GroupVersionKind{Group: "argoproj.io", Version: "v1alpha1", Kind: "Application"}

// TestArgoCDKeepsTheGuardSynced runs the real Argo CD (application controller and repo server,
// make e2e-argocd) on the test API server. The Application of examples/argocd-application.yaml,
// pointed at an OCI registry on loopback that holds this chart (packaged and pushed as a release
// pushes it), syncs it; the guard, run as a test
// process with the chart's arguments and its ServiceAccount's rights, writes its CA into the
// webhooks and its certificate into the Secret; the API server calls it through the rendered
// clientConfig (the Service, untouched), routed to an EndpointSlice of this machine's address.
// The guard refuses a stale exit-handler pod, and the Application stays Synced across hard
// refreshes with no further sync (no self-heal loop), with and without its ignoreDifferences.
// The negative control: with certificates.mode=chart every render differs, and Argo CD syncs
// again on every hard refresh.
func TestArgoCDKeepsTheGuardSynced(t *testing.T) {
	dir, err := testenv.ArgoCDDir()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "examples", "argocd-application.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	app := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &app.Object); err != nil {
		t.Fatal(err)
	}
	release, _, _ := unstructured.NestedString(app.Object, "spec", "source", "helm", "releaseName")
	ns, _, _ := unstructured.NestedString(app.Object, "spec", "destination", "namespace")
	if release == "" || ns == "" {
		t.Fatalf("examples/argocd-application.yaml names no release (%q) or namespace (%q)", release, ns)
	}
	ctx := t.Context()
	installArgoCD(t, dir)
	createOnce(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})

	// The chart, packaged and pushed to an OCI registry on loopback as the release pushes it,
	// and the repository Secret Argo CD needs for a registry served over plain HTTP.
	repoURL := pushChart(t)
	createOnce(t, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "exit-guard-chart", Namespace: argoCDNamespace,
			Labels: map[string]string{"argocd.argoproj.io/secret-type": "repository"}},
		StringData: map[string]string{"url": repoURL, "type": "oci", "insecureOCIForceHttp": "true"},
	})

	redis := miniredis.RunT(t)
	work := t.TempDir()
	kubeconfig := filepath.Join(work, "kubeconfig")
	kc, err := clientcmd.Load(env.KubeConfig())
	if err != nil {
		t.Fatal(err)
	}
	kc.Contexts[kc.CurrentContext].Namespace = argoCDNamespace
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	tools := filepath.Join(work, "bin")
	if err := os.MkdirAll(tools, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(helm(t), filepath.Join(tools, "helm")); err != nil {
		t.Fatal(err)
	}
	out := &testenv.Output{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Argo CD said:\n%s", out)
		}
	})
	acd := testenv.ArgoCD{Dir: dir, Work: work, Redis: redis.Addr(), KubeConfig: kubeconfig, Tools: tools}
	repo, repoAddr, err := acd.StartRepoServer(ctx, out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { _ = repo.Stop() })
	ctrl, err := acd.StartApplicationController(ctx, repoAddr, 20*time.Second, out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { _ = ctrl.Stop() })

	// The recipe, pointed at the local registry (its targetRevision, the chart's version, and
	// its path as they are); the image is never pulled (no kubelet).
	app.SetNamespace(argoCDNamespace)
	must(t, unstructured.SetNestedField(app.Object, repoURL, "spec", "source", "repoURL"))
	if err := env.Client.Create(ctx, app); err != nil {
		t.Fatalf("creating the Application: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), app) })
	first := waitSynced(t, app, "the first sync", time.Time{})

	// The guard, as the Deployment would run it, on a port of this machine's address that the
	// Service's EndpointSlice names. The Secret's content reaches its certificate folder as
	// the kubelet would bring it.
	objs := render(t, profile{name: "argocd"}, release, ns)
	secret := only(t, objs, "Secret")
	gctx, stopGuard := context.WithCancel(ctx)
	defer stopGuard()
	certDir := t.TempDir()
	mountSecret(gctx, t, types.NamespacedName{Namespace: ns, Name: secret.GetName()}, certDir)
	_, g, gout := serveThroughService(gctx, t, objs, certDir, "--cert-namespace="+ns)

	// The guard refuses a stale exit handler, called through the Service as rendered.
	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Create(ctx, fixture.ExitPod(done))
		if err == nil {
			// Admitted while the API server cannot reach a serving guard yet (fail open).
			_ = env.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns))
		}
		return contract.IsRefusal(err), nil
	})
	if err != nil {
		t.Fatalf("the guard never refused the stale exit handler through the Service: %v\nthe guard said:\n%s", err, gout)
	}
	vwc := only(t, objs, "ValidatingWebhookConfiguration")
	if cc := liveWebhookClientConfig(t, vwc.GetName()); cc["url"] != nil || cc["service"] == nil || cc["caBundle"] == nil {
		t.Fatalf("the live clientConfig %v: want the rendered Service with the guard's caBundle", cc)
	}
	written := map[string]any{"webhooks": liveObject(t, vwc).Object["webhooks"], "secret": liveObject(t, secret).Object["data"]}

	// Hard refreshes: Argo CD renders the chart again and compares; nothing the guard wrote
	// may make it sync again.
	for i := range 3 {
		refreshed := hardRefresh(t, app)
		st := waitSynced(t, app, fmt.Sprintf("hard refresh %d", i+1), refreshed)
		if !reflect.DeepEqual(st.operationStarted, first.operationStarted) || st.history != first.history {
			t.Errorf("hard refresh %d: a sync ran again (operation started %v, was %v; %d syncs in the history, was %d)",
				i+1, st.operationStarted, first.operationStarted, st.history, first.history)
		}
		t.Logf("hard refresh %d: %s, health %s", i+1, st.sync, st.health)
	}
	if got := map[string]any{"webhooks": liveObject(t, vwc).Object["webhooks"], "secret": liveObject(t, secret).Object["data"]}; !reflect.DeepEqual(got, written) {
		t.Error("Argo CD changed what the guard wrote (the caBundle or the Secret's data)")
	}
	if err := env.Client.Create(ctx, fixture.ExitPod(done)); !contract.IsRefusal(err) {
		t.Errorf("after the refreshes the stale exit handler: %v, want refused", err)
	}
	first = emergencyOff(t, app, vwc.GetName(), done)

	// Without ignoreDifferences: the chart renders neither the caBundle nor the Secret's data,
	// so Argo CD's default diff (client side, live fields that the render lacks left out)
	// finds nothing to compare either (docs/gitops.md).
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(applicationGVK)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(app), live); err != nil {
		t.Fatal(err)
	}
	unstructured.RemoveNestedField(live.Object, "spec", "ignoreDifferences")
	if err := env.Client.Update(ctx, live); err != nil {
		t.Fatal(err)
	}
	st := waitSynced(t, app, "without ignoreDifferences", hardRefresh(t, app))
	t.Logf("self mode without ignoreDifferences: %s, %d syncs in the history (was %d)", st.sync, st.history, first.history)
	if st.history != first.history {
		t.Errorf("self mode without ignoreDifferences: synced again (%d syncs, was %d)", st.history, first.history)
	}

	// The negative control: certificates.mode=chart renders a new CA into the caBundle and the
	// Secret on every render, and nothing ignores them. Each hard refresh renders again: the
	// Application goes OutOfSync and self-heal syncs it again, a loop the checks above would
	// have caught. (The guard is stopped first: it would write its own CA back.)
	stopGuard()
	if err := g.Stop(); err != nil {
		t.Logf("stopping the guard: %v", err)
	}
	// The Secret's type changes with the mode (Opaque, which self mode renders empty, and
	// kubernetes.io/tls) and cannot be updated: it goes first, as it must for any switch.
	if err := env.Client.Delete(ctx, secret.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(app), live); err != nil {
		t.Fatal(err)
	}
	must(t, unstructured.SetNestedField(live.Object, "chart", "spec", "source", "helm", "valuesObject", "certificates", "mode"))
	// What self mode has and chart mode has not (the guard's certificate rights) is pruned:
	// in the background, since no garbage collector here would finish a foreground deletion.
	opts, _, _ := unstructured.NestedStringSlice(live.Object, "spec", "syncPolicy", "syncOptions")
	must(t, unstructured.SetNestedStringSlice(live.Object, append(opts, "PrunePropagationPolicy=background"), "spec", "syncPolicy", "syncOptions"))
	if err := env.Client.Update(ctx, live); err != nil {
		t.Fatal(err)
	}
	before := waitSynced(t, app, "chart certificates", time.Now())
	// A self-heal sync (of the resources out of sync) starts a new operation; the history
	// keeps full syncs only.
	synced := func(s appState) bool {
		return s.operationStarted != before.operationStarted || s.history != before.history
	}
	sawOutOfSync := false
	for i := 0; i < 3 && !synced(readApp(t, app)); i++ {
		at := hardRefresh(t, app)
		_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			s := readApp(t, app)
			sawOutOfSync = sawOutOfSync || (s.sync == "OutOfSync" && !s.reconciled.Before(at.Truncate(time.Second)))
			return synced(s), nil
		})
	}
	after := readApp(t, app)
	t.Logf("the negative control (chart certificates, no ignoreDifferences): OutOfSync seen %v; last operation started %s (was %s)",
		sawOutOfSync, after.operationStarted, before.operationStarted)
	if !sawOutOfSync || !synced(after) {
		t.Errorf("the negative control: with a new CA in every render Argo CD found no difference (OutOfSync seen %v) or did not sync again (last operation %s, was %s): the checks above prove nothing",
			sawOutOfSync, after.operationStarted, before.operationStarted)
	}
}

// emergencyOff runs the emergency off of docs/gitops.md as written, with a real kubectl:
// automated sync off, the webhook configurations deleted. Through two hard refreshes Argo CD
// must leave them deleted (OutOfSync, no sync), and the stale exit handler is admitted, no
// guard called. Then automated sync goes back on as the example has it: the next sync puts
// them back, the running guard writes its CA into them, and it refuses again. It returns the
// Application's state after that sync.
func emergencyOff(t *testing.T, app *unstructured.Unstructured, vwc string, done *unstructured.Unstructured) appState {
	t.Helper()
	ctx := t.Context()
	before := readApp(t, app)
	if out, err := kubectlShell(t, recipe(t, "docs/gitops.md", "argocd-emergency-off")); err != nil {
		t.Fatalf("the emergency off: %v\n%s", err, out)
	}
	gone := func() bool {
		err := env.Client.Get(ctx, types.NamespacedName{Name: vwc}, &admissionregistrationv1.ValidatingWebhookConfiguration{})
		return apierrors.IsNotFound(err)
	}
	for i := range 2 {
		at := hardRefresh(t, app)
		var s appState
		_ = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			s = readApp(t, app)
			return !s.reconciled.Before(at.Truncate(time.Second)), nil
		})
		t.Logf("emergency off, hard refresh %d: %s, health %s", i+1, s.sync, s.health)
		if s.sync != "OutOfSync" || s.operationStarted != before.operationStarted || !gone() {
			t.Errorf("emergency off, hard refresh %d: %s, operation started %s (was %s), configuration gone %v; want OutOfSync, no sync, gone",
				i+1, s.sync, s.operationStarted, before.operationStarted, gone())
		}
	}
	if err := env.Client.Create(ctx, fixture.ExitPod(done), client.DryRunAll); err != nil {
		t.Errorf("with the guard off, the stale exit handler: %v, want admitted (no webhook)", err)
	}
	automated, found, _ := unstructured.NestedMap(app.Object, "spec", "syncPolicy", "automated")
	if !found {
		t.Fatal("examples/argocd-application.yaml has no syncPolicy.automated to turn back on")
	}
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(applicationGVK)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(app), live); err != nil {
		t.Fatal(err)
	}
	must(t, unstructured.SetNestedMap(live.Object, automated, "spec", "syncPolicy", "automated"))
	if err := env.Client.Update(ctx, live); err != nil {
		t.Fatal(err)
	}
	after := waitSynced(t, app, "automated sync back on", hardRefresh(t, app))
	if gone() || after.operationStarted == before.operationStarted {
		t.Fatalf("automated sync back on: configuration gone %v, operation started %s (was %s)", gone(), after.operationStarted, before.operationStarted)
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		return contract.IsRefusal(env.Client.Create(ctx, fixture.ExitPod(done), client.DryRunAll)), nil
	})
	if err != nil {
		t.Fatalf("after the emergency off was undone, the guard never refused the stale exit handler again: %v", err)
	}
	t.Logf("emergency off: the configurations stayed deleted through 2 hard refreshes; back %s after automated sync was turned on", after.reconciled.Format(time.TimeOnly))
	return after
}

// appState is what the test reads of an Application's status.
type appState struct {
	sync, health, phase, message string
	reconciled                   time.Time
	operationStarted             string
	history                      int
}

func readApp(t *testing.T, app *unstructured.Unstructured) appState {
	t.Helper()
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(applicationGVK)
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(app), live); err != nil {
		t.Fatal(err)
	}
	var s appState
	s.sync, _, _ = unstructured.NestedString(live.Object, "status", "sync", "status")
	s.health, _, _ = unstructured.NestedString(live.Object, "status", "health", "status")
	s.phase, _, _ = unstructured.NestedString(live.Object, "status", "operationState", "phase")
	s.operationStarted, _, _ = unstructured.NestedString(live.Object, "status", "operationState", "startedAt")
	s.message, _, _ = unstructured.NestedString(live.Object, "status", "operationState", "message")
	if at, _, _ := unstructured.NestedString(live.Object, "status", "reconciledAt"); at != "" {
		s.reconciled, _ = time.Parse(time.RFC3339, at)
	}
	h, _, _ := unstructured.NestedSlice(live.Object, "status", "history")
	s.history = len(h)
	return s
}

// waitSynced waits until the Application, reconciled after since, is Synced with its last sync
// Succeeded.
func waitSynced(t *testing.T, app *unstructured.Unstructured, when string, since time.Time) appState {
	t.Helper()
	var s appState
	err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		s = readApp(t, app)
		return s.sync == "Synced" && s.phase == "Succeeded" && !s.reconciled.Before(since.Truncate(time.Second)), nil
	})
	if err != nil {
		t.Fatalf("%s: the Application is not Synced: %v (status %+v)", when, err, s)
	}
	return s
}

// hardRefresh asks Argo CD to render the Application again, and returns when it asked.
func hardRefresh(t *testing.T, app *unstructured.Unstructured) time.Time {
	t.Helper()
	at := time.Now()
	patch := []byte(`{"metadata":{"annotations":{"argocd.argoproj.io/refresh":"hard"}}}`)
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(applicationGVK)
	live.SetNamespace(app.GetNamespace())
	live.SetName(app.GetName())
	if err := env.Client.Patch(t.Context(), live, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	// Argo CD removes the annotation once it has refreshed.
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(app), live); err != nil {
			return false, err
		}
		_, pending := live.GetAnnotations()["argocd.argoproj.io/refresh"]
		return !pending, nil
	})
	if err != nil {
		t.Fatalf("Argo CD did not take the hard refresh: %v", err)
	}
	return at
}

// installArgoCD installs Argo CD's CRDs and what its controller reads in its namespace: the
// argocd-cm and argocd-secret it expects, and the default AppProject its API server would
// create.
func installArgoCD(t *testing.T, dir string) {
	t.Helper()
	for _, f := range []string{"application-crd.yaml", "appproject-crd.yaml"} {
		raw, err := os.ReadFile(filepath.Join(dir, "crds", f))
		if err != nil {
			t.Fatal(err)
		}
		crd := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
			t.Fatal(err)
		}
		createOnce(t, crd)
		err = wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(crd), crd); err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("CRD %s not established: %v", crd.GetName(), err)
		}
	}
	partOf := map[string]string{"app.kubernetes.io/part-of": "argocd"}
	createOnce(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: argoCDNamespace}})
	createOnce(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: argoCDNamespace, Name: "argocd-cm", Labels: partOf}})
	createOnce(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: argoCDNamespace, Name: "argocd-secret", Labels: partOf},
		Data: map[string][]byte{"server.secretkey": []byte("exit-guard-test")}})
	project := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
		"metadata": map[string]any{"namespace": argoCDNamespace, "name": "default"},
		"spec": map[string]any{
			"sourceRepos":              []any{"*"},
			"destinations":             []any{map[string]any{"server": "*", "namespace": "*"}},
			"clusterResourceWhitelist": []any{map[string]any{"group": "*", "kind": "*"}},
		},
	}}
	createOnce(t, project)
}

// pushChart packages the chart of this checkout (its files as they are) and pushes it to an OCI
// registry served in memory on loopback over plain HTTP, as hack/release.sh pushes it to
// ghcr.io; it returns the chart's address, oci://<host>/charts/exit-guard.
func pushChart(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	runHelm(t, "package", chartDir, "--destination", dir)
	pkgs, err := filepath.Glob(filepath.Join(dir, "exit-guard-*.tgz"))
	if err != nil || len(pkgs) != 1 {
		t.Fatalf("helm package wrote %v (%v), want one exit-guard-*.tgz", pkgs, err)
	}
	runHelm(t, "push", pkgs[0], "oci://"+host+"/charts", "--plain-http")
	return "oci://" + host + "/charts/exit-guard"
}

func liveWebhookClientConfig(t *testing.T, name string) map[string]any {
	t.Helper()
	l := &unstructured.Unstructured{}
	l.SetGroupVersionKind(schema.GroupVersionKind{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingWebhookConfiguration"})
	if err := env.Client.Get(t.Context(), types.NamespacedName{Name: name}, l); err != nil {
		t.Fatal(err)
	}
	hooks, _, _ := unstructured.NestedSlice(l.Object, "webhooks")
	if len(hooks) == 0 {
		t.Fatalf("ValidatingWebhookConfiguration %s has no webhooks", name)
	}
	cc, _ := hooks[0].(map[string]any)["clientConfig"].(map[string]any)
	return cc
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
