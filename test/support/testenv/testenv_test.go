//go:build envtest

package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/internal/argo"
)

var (
	env *Env
	// auditLog is where the API server logs ControllerUser's writes (AuditWrites).
	auditLog string
)

const denyPath = "/deny-labelled-pods"

func TestMain(m *testing.M) {
	path := denyPath
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "testenv-deny"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "deny.testenv.exit-guard.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: "default", Name: "unused", Path: &path},
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"testenv/deny": "true"}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	dir, err := os.MkdirTemp("", "testenv-audit")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var flags map[string]string
	if flags, auditLog, err = AuditWrites(dir, ControllerUser); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := Main(m, Options{ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{vwc}, APIServerFlags: flags}, &env)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func workflow(name string) *unstructured.Unstructured {
	wf := &unstructured.Unstructured{}
	wf.SetGroupVersionKind(argo.WorkflowGVK)
	wf.SetNamespace("default")
	wf.SetName(name)
	wf.Object["spec"] = map[string]any{"entrypoint": "main"}
	return wf
}

// TestWorkflowStatusWriteIsAWholeObjectUpdate writes status the way Argo's controller does and
// checks what the guard relies on: with no status subresource, a status write is an Update of
// the whole object that advances both metadata.generation and resourceVersion, and a write
// from an older copy is refused with a conflict.
func TestWorkflowStatusWriteIsAWholeObjectUpdate(t *testing.T) {
	ctx := t.Context()
	wf := workflow("status-write")
	if err := env.Client.Create(ctx, wf); err != nil {
		t.Fatalf("creating the workflow: %v", err)
	}
	stale := wf.DeepCopy()
	gen0, rv0 := wf.GetGeneration(), wf.GetResourceVersion()

	wf.Object["status"] = map[string]any{"phase": "Succeeded"}
	if err := env.Client.Update(ctx, wf); err != nil {
		t.Fatalf("writing the status with Update: %v", err)
	}
	if got := wf.GetGeneration(); got != gen0+1 {
		t.Errorf("generation after a status write = %d, want %d (no status subresource)", got, gen0+1)
	}
	cmp, err := resourceversion.CompareResourceVersion(wf.GetResourceVersion(), rv0)
	if err != nil || cmp <= 0 {
		t.Errorf("resourceVersion %q after the write is not newer than %q (err %v)", wf.GetResourceVersion(), rv0, err)
	}

	got := workflow("status-write")
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(wf), got); err != nil {
		t.Fatal(err)
	}
	if phase, _, _ := unstructured.NestedString(got.Object, "status", "phase"); phase != "Succeeded" {
		t.Errorf("status.phase read back = %q, want Succeeded", phase)
	}

	// A label-only patch moves resourceVersion but not generation.
	patch := client.MergeFrom(got.DeepCopy())
	got.SetLabels(map[string]string{"workflows.argoproj.io/completed": "true"})
	if err := env.Client.Patch(ctx, got, patch); err != nil {
		t.Fatal(err)
	}
	if got.GetGeneration() != gen0+1 {
		t.Errorf("generation after a label patch = %d, want %d", got.GetGeneration(), gen0+1)
	}

	stale.Object["status"] = map[string]any{"phase": "Error"}
	err = env.Client.Update(ctx, stale)
	if !apierrors.IsConflict(err) {
		t.Errorf("Update from a stale copy: err = %v, want a conflict", err)
	}
}

// TestWebhookRegisteredThroughEnvtestIsCalled serves a throwaway admission handler on the
// address envtest registered, and checks that the API server calls it and refuses the pod.
func TestWebhookRegisteredThroughEnvtestIsCalled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	calls := make(chan string, 16)
	srv := webhook.NewServer(webhook.Options{Host: env.WebhookHost, Port: env.WebhookPort, CertDir: env.WebhookCertDir})
	srv.Register(denyPath, &admission.Webhook{Handler: admission.HandlerFunc(
		func(_ context.Context, req admission.Request) admission.Response {
			calls <- req.Name
			return admission.Denied("testenv refuses pods labelled testenv/deny")
		})})
	errc := make(chan error, 1)
	go func() { errc <- srv.Start(ctx) }()
	waitServing(t, srv)

	pod := func(name string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}
	}
	err := env.Client.Create(ctx, pod("denied", map[string]string{"testenv/deny": "true"}))
	if !apierrors.IsForbidden(err) {
		t.Fatalf("creating a labelled pod: err = %v, want Forbidden from the webhook", err)
	}
	select {
	case name := <-calls:
		if name != "denied" {
			t.Errorf("webhook saw pod %q, want %q", name, "denied")
		}
	default:
		t.Fatal("the API server refused the pod but the webhook was never called")
	}

	if err := env.Client.Create(ctx, pod("admitted", nil)); err != nil {
		t.Fatalf("creating an unlabelled pod (outside the objectSelector): %v", err)
	}
	if n := len(calls); n != 0 {
		t.Errorf("webhook called %d times for a pod outside its objectSelector", n)
	}
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("webhook server: %v", err)
	}
}

// waitServing polls until the webhook server accepts TLS connections.
func waitServing(t *testing.T, srv webhook.Server) {
	t.Helper()
	check := srv.StartedChecker()
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return check(req) == nil, nil })
	if err != nil {
		t.Fatalf("webhook server on %s never served: %v", fmt.Sprint(env.WebhookHost, ":", strconv.Itoa(env.WebhookPort)), err)
	}
}

// TestAuditRecordsTheControllersWritesOnly: the census of a stale pass reads, from the API
// server's own audit log, every write the controller's user makes, landed or refused, with its
// verb, resource and answer, and nothing of anyone else's.
func TestAuditRecordsTheControllersWritesOnly(t *testing.T) {
	// As Argo's controller does in the e2e: from the kubeconfig file of KubeConfigAs.
	kc, _, err := env.KubeConfigAs(ControllerUser, "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := Namespace(t, env.Client, "audit-", nil)
	cm := func(name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	if err := c.Create(t.Context(), cm("memo")); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), cm("memo")); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("a second create: %v, want AlreadyExists", err)
	}
	if err := c.Patch(t.Context(), cm("memo"), client.RawPatch(types.MergePatchType, []byte(`{"data":{"k":"v"}}`))); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(t.Context(), cm("memo")); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(t.Context(), cm("admin")); err != nil {
		t.Fatal(err)
	}
	want := []string{"create configmaps 201 memo", "create configmaps 409 memo", "patch configmaps 200 memo", "delete configmaps 200 memo"}
	var got []string
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		writes, err := ReadWrites(auditLog)
		if err != nil {
			return false, err
		}
		got = nil
		for _, w := range writes {
			if w.Namespace == ns {
				if w.User != ControllerUser {
					return false, fmt.Errorf("the log holds a write of %s: %v", w.User, w)
				}
				got = append(got, w.String()+" "+w.Name)
			}
		}
		return len(got) >= len(want), nil
	})
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("the controller's writes in the audit log: %q (%v), want %q", got, err, want)
	}
}
