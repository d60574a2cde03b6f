//go:build envtest

package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// post sends body to the guard's path over TLS, trusting the test CA.
func post(t *testing.T, path, contentType string, body []byte) (int, admissionv1.AdmissionReview, string) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.WebhookCAData)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	url := fmt.Sprintf("https://%s:%d%s", env.WebhookHost, env.WebhookPort, path)
	resp, err := c.Post(url, contentType, bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(raw, &review); err != nil {
		t.Fatalf("answer to POST %s is not an AdmissionReview: %v: %s", path, err, raw)
	}
	return resp.StatusCode, review, string(raw)
}

func TestMalformedRequestsGetA400WithAReason(t *testing.T) {
	startGuard(t, Options{}, harnessOptions{})
	podGVR := metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	tests := []struct {
		name        string
		contentType string
		body        []byte
		wantReason  string
	}{
		{"an empty body", "application/json", nil, "request body is empty"},
		{"not JSON", "application/json", []byte("{not json"), "invalid character"},
		{"the wrong content type", "text/plain", reviewBody(admissionv1.AdmissionRequest{UID: "1"}), "contentType=text/plain"},
		{"a review with no request uid", "application/json", reviewBody(admissionv1.AdmissionRequest{Resource: podGVR, Operation: admissionv1.Create}), "request.uid is empty"},
		{"a pod create with no object", "application/json", reviewBody(admissionv1.AdmissionRequest{UID: "2", Resource: podGVR, Operation: admissionv1.Create}), "request.object is empty"},
		{"an object that is not a pod", "application/json", reviewBody(admissionv1.AdmissionRequest{UID: "3", Resource: podGVR, Operation: admissionv1.Create,
			Object: runtime.RawExtension{Raw: []byte(`{"metadata":"a string"}`)}}), "request.object is not a pod"},
	}
	for _, path := range []string{ValidatePath, MutatePath} {
		for _, tt := range tests {
			t.Run(path+" "+tt.name, func(t *testing.T) {
				code, rev, raw := post(t, path, tt.contentType, tt.body)
				if code != http.StatusBadRequest {
					t.Errorf("HTTP status %d, want 400: %s", code, raw)
				}
				if rev.Response == nil || rev.Response.Allowed || rev.Response.Result == nil || rev.Response.Result.Code != http.StatusBadRequest {
					t.Fatalf("response %s, want a refusal with code 400", raw)
				}
				if !strings.Contains(rev.Response.Result.Message, tt.wantReason) {
					t.Errorf("reason %q does not say %q", rev.Response.Result.Message, tt.wantReason)
				}
			})
		}
	}
}

func TestMalformedTaskSetWritesGetA400WithAReason(t *testing.T) {
	startGuard(t, Options{}, harnessOptions{})
	ts := []byte(`{"metadata":{"name":"w","namespace":"ns"},"spec":{"tasks":{}}}`)
	for _, tt := range []struct {
		name       string
		req        admissionv1.AdmissionRequest
		wantReason string
	}{
		{"no request uid", admissionv1.AdmissionRequest{Resource: taskSetResource, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: ts}}, "request.uid is empty"},
		{"a create with no object", admissionv1.AdmissionRequest{UID: "1", Resource: taskSetResource, Operation: admissionv1.Create}, "request.object is empty"},
		{"an update with no old object", admissionv1.AdmissionRequest{UID: "2", Resource: taskSetResource, Operation: admissionv1.Update, Object: runtime.RawExtension{Raw: ts}}, "request.oldObject is empty"},
		{"tasks that are not a map", admissionv1.AdmissionRequest{UID: "3", Resource: taskSetResource, Operation: admissionv1.Create,
			Object: runtime.RawExtension{Raw: []byte(`{"spec":{"tasks":["a"]}}`)}}, "request.object is not a WorkflowTaskSet"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, rev, raw := post(t, ValidateTaskSetPath, "application/json", reviewBody(tt.req))
			if code != http.StatusBadRequest || rev.Response == nil || rev.Response.Allowed || rev.Response.Result == nil ||
				rev.Response.Result.Code != http.StatusBadRequest {
				t.Fatalf("HTTP %d %s, want a refusal with code 400", code, raw)
			}
			if !strings.Contains(rev.Response.Result.Message, tt.wantReason) {
				t.Errorf("reason %q does not say %q", rev.Response.Result.Message, tt.wantReason)
			}
		})
	}
}

func TestRequestsThatAreNotPodCreatesAreAllowedWithAReason(t *testing.T) {
	startGuard(t, Options{}, harnessOptions{})
	pod := []byte(`{"metadata":{"name":"p","namespace":"ns"}}`)
	for _, tc := range []struct {
		name string
		req  admissionv1.AdmissionRequest
		want string
	}{
		{"a pod update", admissionv1.AdmissionRequest{UID: "1", Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Operation: admissionv1.Update, Object: runtime.RawExtension{Raw: pod}}, "only reviews pod creation"},
		{"a configmap", admissionv1.AdmissionRequest{UID: "2", Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: pod}}, "only reviews pods, not configmaps"},
		{"a pod subresource", admissionv1.AdmissionRequest{UID: "3", Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, SubResource: "binding", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: pod}}, "not pods/binding"},
		{"a TaskSet sent to the pod path", admissionv1.AdmissionRequest{UID: "4", Resource: taskSetResource, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: pod}}, "only reviews pods, not workflowtasksets.argoproj.io"},
		{"a TaskSet deletion", admissionv1.AdmissionRequest{UID: "5", Resource: taskSetResource, Operation: admissionv1.Delete, OldObject: runtime.RawExtension{Raw: pod}}, "only reviews WorkflowTaskSet creation and updates, not DELETE"},
		{"a TaskSet status write", admissionv1.AdmissionRequest{UID: "6", Resource: taskSetResource, SubResource: "status", Operation: admissionv1.Update, Object: runtime.RawExtension{Raw: pod}, OldObject: runtime.RawExtension{Raw: pod}}, "not workflowtasksets.argoproj.io/status"},
		{"a pod sent to the TaskSet path", admissionv1.AdmissionRequest{UID: "7", Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: pod}}, "only reviews workflowtasksets.argoproj.io, not pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := ValidatePath
			if strings.Contains(tc.name, "TaskSet") && !strings.Contains(tc.name, "pod path") {
				path = ValidateTaskSetPath
			}
			code, rev, raw := post(t, path, "application/json", reviewBody(tc.req))
			if code != http.StatusOK || rev.Response == nil || !rev.Response.Allowed {
				t.Fatalf("HTTP %d %s, want allowed", code, raw)
			}
			if rev.Response.Result == nil || !strings.Contains(rev.Response.Result.Message, tc.want) {
				t.Errorf("reason %s does not say %q", raw, tc.want)
			}
		})
	}
}

func TestDenialCarriesAuditAnnotations(t *testing.T) {
	h := startGuard(t, Options{}, harnessOptions{noWatch: true})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	h.store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: ns, Name: "done", ResourceVersion: wf.GetResourceVersion(), Phase: argo.PhaseSucceeded})
	raw, _ := json.Marshal(fixture.ExitPod(wf))
	code, rev, body := post(t, ValidatePath, "application/json", reviewBody(admissionv1.AdmissionRequest{
		UID: "audit-1", Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Operation: admissionv1.Create,
		Namespace: ns, Object: runtime.RawExtension{Raw: raw}}))
	if code != http.StatusOK || rev.Response == nil || rev.Response.Allowed {
		t.Fatalf("HTTP %d %s, want a denial", code, body)
	}
	want := map[string]string{"decision": "denied", "reason": "workflow-completed", "workflow": ns + "/done",
		"workflow-uid": string(wf.GetUID()), "pod-kind": "exit-handler", "source": "live-read", "phase": "Succeeded"}
	for k, v := range want {
		if got := rev.Response.AuditAnnotations[k]; got != v {
			t.Errorf("audit annotation %s = %q, want %q", k, got, v)
		}
	}
	if rev.Response.Result.Code != http.StatusTooManyRequests {
		t.Errorf("denial code %d, want 429", rev.Response.Result.Code)
	}

	// A WorkflowTaskSet write names what it adds instead of a pod kind.
	key := argo.NodeID("done", argo.OnExitNodeName("done"))
	after := fixture.TaskSet(wf, map[string]any{key: fixture.HTTPTask("notify")})
	before := fixture.TaskSet(wf, map[string]any{})
	before.SetLabels(map[string]string{argo.LabelCompleted: "true"})
	code, rev, body = post(t, ValidateTaskSetPath, "application/json", reviewBody(admissionv1.AdmissionRequest{
		UID: "audit-2", Resource: taskSetResource, Operation: admissionv1.Update, Namespace: ns, Name: "done",
		Object: runtime.RawExtension{Raw: fixture.JSON(after.Object)}, OldObject: runtime.RawExtension{Raw: fixture.JSON(before.Object)}}))
	if code != http.StatusOK || rev.Response == nil || rev.Response.Allowed {
		t.Fatalf("HTTP %d %s, want a denial", code, body)
	}
	want = map[string]string{"decision": "denied", "reason": "workflow-completed", "workflow": ns + "/done", "kind": argo.TaskSetKind,
		"workflow-uid": string(wf.GetUID()), "tasks-added": key, "completed-reopened": "true", "source": "live-read", "phase": "Succeeded"}
	for k, v := range want {
		if got := rev.Response.AuditAnnotations[k]; got != v {
			t.Errorf("TaskSet audit annotation %s = %q, want %q", k, got, v)
		}
	}
	if _, ok := rev.Response.AuditAnnotations["pod-kind"]; ok {
		t.Error("a TaskSet write's audit annotations name a pod kind")
	}
}

// TestHandlerFailuresReachTheAPIServerAsHTTPErrors: a panic in the guard is not a refusal. It
// reaches the API server as an HTTP 500, so that the webhook's failurePolicy applies: with
// Ignore, the pod is admitted.
func TestHandlerFailuresReachTheAPIServerAsHTTPErrors(t *testing.T) {
	// A live read with a bug in it.
	var calls atomic.Int32
	bug := func(context.Context) error {
		calls.Add(1)
		panic("a bug in the live read")
	}
	h := startGuard(t, Options{}, harnessOptions{noWatch: true, reader: faultyReader(t, bug, bug)})
	// A namespace the test webhooks (failurePolicy Fail) do not see; one webhook that fails
	// open is registered for it alone.
	failOpen := map[string]string{"exit-guard-fail-open": "true"}
	ns := testenv.Namespace(t, env.Client, "t-", failOpen)
	wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)

	raw, _ := json.Marshal(fixture.ExitPod(wf))
	code, rev, body := post(t, ValidatePath, "application/json", reviewBody(admissionv1.AdmissionRequest{
		UID: "panic-1", Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Operation: admissionv1.Create,
		Namespace: ns, Object: runtime.RawExtension{Raw: raw}}))
	if code != http.StatusInternalServerError {
		t.Errorf("HTTP status %d for a handler that panicked, want 500: %s", code, body)
	}
	if rev.Response == nil || rev.Response.Result == nil || !strings.Contains(rev.Response.Result.Message, "panic") {
		t.Errorf("answer %s does not say the handler panicked", body)
	}
	if got := h.counter(t, "exit_guard_panics_total", map[string]string{"where": "admission"}); got != 1 {
		t.Errorf("exit_guard_panics_total{where=\"admission\"} = %v, want 1", got)
	}

	ignore := admissionregistrationv1.Ignore
	none := admissionregistrationv1.SideEffectClassNone
	url := fmt.Sprintf("https://%s:%d%s", env.WebhookHost, env.WebhookPort, ValidatePath)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "exit-guard-fail-open-" + ns},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "validate.exit-guard.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: env.WebhookCAData},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: failOpen},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{argo.LabelWorkflow: wf.GetName()}},
			FailurePolicy:           &ignore,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if err := env.Client.Create(t.Context(), vwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), vwc) })
	// The API server takes the new configuration in a moment later: create until the guard
	// is called, and judge the create that called it.
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true,
		func(ctx context.Context) (bool, error) {
			before := calls.Load()
			err := env.Client.Create(ctx, fixture.ExitPod(wf), client.DryRunAll)
			if calls.Load() == before {
				return false, nil
			}
			if err != nil {
				t.Errorf("pod refused when the guard failed and the webhook fails open: %v", err)
			}
			return true, nil
		})
	if err != nil {
		t.Fatalf("the API server never called the guard: %v", err)
	}
}

// TestALatePanicIsLoggedAndCounted: a read that panics after the decision was made from
// another one (here the GET beside a slow LIST, once the LIST answered) cannot reach the
// request any more; it is logged with its stack and counted, not dropped.
func TestALatePanicIsLoggedAndCounted(t *testing.T) {
	// The LIST answers once the GET has started beside it; the GET panics once the request
	// has had its answer. Each waits at most 10 s, so that a guard that never starts the GET
	// fails the test instead of hanging it.
	getStarted, decided := make(chan struct{}), make(chan struct{})
	var startOnce sync.Once
	list := func(context.Context) error {
		select {
		case <-getStarted:
		case <-time.After(10 * time.Second):
		}
		return nil
	}
	get := func(context.Context) error {
		startOnce.Do(func() { close(getStarted) })
		select {
		case <-decided:
		case <-time.After(10 * time.Second):
		}
		panic("a bug in the GET beside the LIST")
	}
	h := startGuard(t, Options{GetBesideListAfter: 20 * time.Millisecond}, harnessOptions{noWatch: true, reader: faultyReader(t, list, get)})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "running", argo.PhaseRunning)
	err := env.Client.Create(t.Context(), fixture.ExitPod(wf), client.DryRunAll)
	close(decided)
	if err != nil {
		t.Fatalf("the exit handler of a running workflow, decided by the LIST: %v, want admitted", err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		// The counter and the log line are written one after the other: wait for both.
		return h.counter(t, "exit_guard_panics_total", map[string]string{"where": "live-read"}) == 1 &&
			len(guardLog.Lines(`a live read panicked after its decision`)) > 0, nil
	})
	if err != nil {
		t.Fatalf("exit_guard_panics_total{where=\"live-read\"} = %v, want 1", h.counter(t, "exit_guard_panics_total", map[string]string{"where": "live-read"}))
	}
	lines := guardLog.Lines(`a live read panicked after its decision`)
	if len(lines) != 1 || !strings.Contains(lines[0], "a bug in the GET beside the LIST") || !strings.Contains(lines[0], "goroutine") {
		t.Errorf("log lines for the late panic: %q, want one with the panic and its stack", lines)
	}
}
