//go:build envtest

package faults

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
	"github.com/exit-guard/exit-guard/webhook"
)

// TestOnlyTheAPIServerIsAnswered runs the guard with --webhook-client-ca-file against a real
// API server that presents a client certificate to webhooks, as a cluster sets it up: its
// admission configuration gives the validating and the mutating webhook plugins a kubeconfig
// whose user is named after the webhook's Service, exit-guard.<namespace>.svc. The webhooks
// name that Service (no URL); the API server routes to its EndpointSlice, an address of this
// machine. Both webhooks fail closed, so an ordinary pod is admitted only if the guard answered
// both.
//
// The guard starts with the wrong client CA: the API server's calls are refused, and counted
// (exit_guard_webhook_clients_refused_total, which the chart's alert reads: with failurePolicy
// Ignore they would fail open without a word). The CA file is then replaced, and the guard
// reads it again without a restart: the calls are answered, a stale exit handler is refused. A
// review posted straight to the port, with no client certificate or one of another CA, gets no
// answer: no decision, no Event.
func TestOnlyTheAPIServerIsAnswered(t *testing.T) {
	const svcNS, svcName = "exit-guard-system", "exit-guard"
	svcHost := svcName + "." + svcNS + ".svc"
	dir := t.TempDir()
	ip := testenv.HostAddress(t)

	serverCA, clientCA, otherCA := testenv.NewCA(t, "serving CA"), testenv.NewCA(t, "API server client CA"), testenv.NewCA(t, "another CA")
	crt, key := serverCA.Issue(t, svcHost, x509.ExtKeyUsageServerAuth, []string{svcHost}, []net.IP{ip})
	certDir := filepath.Join(dir, "serving")
	clientCAFile := filepath.Join(dir, "client-ca", "ca.crt")
	for path, data := range map[string][]byte{filepath.Join(certDir, "tls.crt"): crt, filepath.Join(certDir, "tls.key"): key, clientCAFile: otherCA.PEM} {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// The API server's side: its client certificate, in the kubeconfig of both plugins.
	apiCrt, apiKey := clientCA.Issue(t, "kube-apiserver-admission", x509.ExtKeyUsageClientAuth, nil, nil)
	kc := clientcmdapi.NewConfig()
	kc.AuthInfos[svcHost] = &clientcmdapi.AuthInfo{ClientCertificateData: apiCrt, ClientKeyData: apiKey}
	kcPath := filepath.Join(dir, "admission-kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kcPath); err != nil {
		t.Fatal(err)
	}
	admissionConfig := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ValidatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: %[1]s
  - name: MutatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: %[1]s
`, kcPath)
	acPath := filepath.Join(dir, "admission-config.yaml")
	if err := os.WriteFile(acPath, []byte(admissionConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := testenv.Start(testenv.Options{APIServerFlags: map[string]string{
		"admission-control-config-file": acPath,
		// Service webhooks are called at an endpoint of the Service (there is no kube-proxy
		// for a cluster IP here).
		"enable-aggregator-routing": "true",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	c := e.Client

	port := testenv.TestPort(t)
	portStr := strconv.Itoa(port)
	out := &testenv.Output{}
	g, err := testenv.StartGuard(t.Context(), guardBin, e.KubeConfig(), []string{"--webhook-port=" + portStr,
		"--webhook-cert-path=" + certDir, "--webhook-client-ca-file=" + clientCAFile, "--shutdown-delay=0s"}, out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { _ = g.Stop() })
	r := &replica{name: "mtls", g: g, out: out}

	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: svcNS}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: svcNS, Name: svcName},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "webhook", Port: 443, TargetPort: intstr.FromInt(port)}}}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: svcNS, Name: svcName,
			Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("webhook"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}}},
	} {
		if err := c.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	ns := "mtls-" + strconv.FormatInt(time.Now().UnixNano()%100000, 10)
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"exit-guard-mtls": "true"}}}); err != nil {
		t.Fatal(err)
	}
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	rule := []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}
	ref := func(path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{CABundle: serverCA.PEM,
			Service: &admissionregistrationv1.ServiceReference{Namespace: svcNS, Name: svcName, Path: ptr.To(path), Port: ptr.To(int32(443))}}
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"exit-guard-mtls": "true"}}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "exit-guard-mtls"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "validate.exit-guard.io", ClientConfig: ref(webhook.ValidatePath),
			Rules: rule, FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel}}}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "exit-guard-mtls"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "mutate.exit-guard.io", ClientConfig: ref(webhook.MutatePath),
			Rules: rule, FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel}}}
	for _, o := range []client.Object{vwc, mwc} {
		if err := c.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}

	wf := testenv.CreateWorkflow(t, c, ns, "notify", argo.PhaseSucceeded)
	plain := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	}
	untrusted := `exit_guard_webhook_clients_refused_total{reason="untrusted"}`
	noCert := `exit_guard_webhook_clients_refused_total{reason="no-certificate"}`
	denied := `exit_guard_decisions_total{kind="Pod",reason="workflow-completed",source="live-read",verdict="denied"}`

	t.Run("the wrong client CA: the API server's calls are refused, and counted", func(t *testing.T) {
		// The webhook's endpoint may take a moment to be known to the API server: until then
		// the call fails too, but is not counted by the guard.
		waitFor(t, "a refused handshake of the API server's call", func() bool {
			err := c.Create(t.Context(), plain("plain-"+strconv.FormatInt(time.Now().UnixNano()%1000000, 10)))
			return err != nil && r.metric(t, untrusted) > 0
		})
		if got := r.metric(t, noCert); got != 0 {
			t.Errorf("%s = %v: the API server presents a certificate, and the readiness probe its own", noCert, got)
		}
	})

	t.Run("the client CA replaced: read again, both webhooks answered", func(t *testing.T) {
		if err := os.WriteFile(clientCAFile+".new", clientCA.PEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(clientCAFile+".new", clientCAFile); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "an ordinary pod admitted through both webhooks", func() bool {
			return c.Create(t.Context(), plain("plain-"+strconv.FormatInt(time.Now().UnixNano()%1000000, 10))) == nil
		})
		err := c.Create(t.Context(), fixture.ExitPod(wf))
		if reason, ok := contract.RefusalReason(err); !ok || reason != contract.ReasonWorkflowCompleted {
			t.Fatalf("the exit handler of a Succeeded workflow: %v, want the guard's refusal (workflow-completed)", err)
		}
		for _, path := range []string{webhook.ValidatePath, webhook.MutatePath} {
			if got := r.metric(t, `controller_runtime_webhook_requests_total{code="200",webhook="`+path+`"}`); got < 1 {
				t.Errorf("requests answered on %s: %v, want at least 1", path, got)
			}
		}
		waitFor(t, "the refusal's Event", func() bool { return countEvents(t, c, wf, contract.EventReasonDenied) == 1 })
	})

	t.Run("a review posted to the port without the API server's certificate gets no answer", func(t *testing.T) {
		body := forgedReview(fixture.ExitPod(wf), "forged")
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(serverCA.PEM)
		otherCrt, otherKey := otherCA.Issue(t, "kube-apiserver-admission", x509.ExtKeyUsageClientAuth, nil, nil)
		other, err := tls.X509KeyPair(otherCrt, otherKey)
		if err != nil {
			t.Fatal(err)
		}
		before := r.metric(t, denied)
		for _, tc := range []struct {
			name  string
			certs []tls.Certificate
		}{{"no client certificate", nil}, {"a client certificate of another CA", []tls.Certificate{other}}} {
			hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
				RootCAs: pool, ServerName: svcHost, Certificates: tc.certs, MinVersion: tls.VersionTLS12}}}
			resp, err := hc.Post("https://"+net.JoinHostPort(ip.String(), portStr)+webhook.ValidatePath, "application/json", bytes.NewReader(body))
			if err == nil {
				_ = resp.Body.Close()
				t.Errorf("%s: answered %s; want the handshake refused", tc.name, resp.Status)
			}
		}
		if got := r.metric(t, noCert); got < 1 {
			t.Errorf("%s = %v, want the review without a certificate counted", noCert, got)
		}
		// The guard writes its Events asynchronously, one after another: once the Event of a
		// later refusal (through the API server) is there, a forged one would be too. The
		// recorder folds a repeat into the Event already written (its series), so the decision
		// counter is the witness that nothing was decided; the Event count that no new Event
		// was made.
		later := testenv.CreateWorkflow(t, c, ns, "later", argo.PhaseSucceeded)
		if err := c.Create(t.Context(), fixture.ExitPod(later)); !contract.IsRefusal(err) {
			t.Fatalf("a later stale exit handler through the API server: %v, want refused", err)
		}
		waitFor(t, "the later refusal's Event", func() bool { return countEvents(t, c, later, contract.EventReasonDenied) == 1 })
		if got := r.metric(t, denied); got != before+1 {
			t.Errorf("%s went from %v to %v, want only the later refusal's 1 more: a forged review was decided", denied, before, got)
		}
		if n := countEvents(t, c, wf, contract.EventReasonDenied); n != 1 {
			t.Errorf("%d %s Events on the workflow, want the 1 of the API server's request: a forged review wrote one", n, contract.EventReasonDenied)
		}
	})
}

func countEvents(t *testing.T, c client.Client, wf client.Object, reason string) int {
	t.Helper()
	return testenv.CountEvents(t.Context(), t, c, testenv.About(wf, reason))
}

// forgedReview is the AdmissionReview of pod's create, as a client that reaches the webhook
// port directly would send it.
func forgedReview(pod *corev1.Pod, uid string) []byte {
	return fixture.JSON(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID(uid), Operation: admissionv1.Create, Namespace: pod.Namespace,
			Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Object:   runtime.RawExtension{Raw: fixture.JSON(pod)}}})
}

// TestForgedReviewsDoBoundedWork: without client certificates anyone who reaches the port can
// post reviews. With the API server's reads hanging, a burst of forged reviews of a real
// workflow's exit handler makes the guard read live for --max-concurrent-decisions of them
// only (each read bounded by its attempts); the rest are shed at once to the store, counted.
func TestForgedReviewsDoBoundedWork(t *testing.T) {
	const slots, burst = 4, 60
	p := testenv.StartAPIProxy(t, env.Config)
	port := strconv.Itoa(testenv.TestPort(t))
	out := &testenv.Output{}
	g, err := testenv.StartGuard(t.Context(), guardBin, p.KubeConfig(t), []string{"--webhook-port=" + port, "--webhook-cert-path=" + env.WebhookCertDir,
		"--shutdown-delay=0s", "--max-concurrent-decisions=" + strconv.Itoa(slots), "--live-read-timeout=300ms", "--live-read-budget=2s"}, out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { _ = g.Stop() })
	r := &replica{name: "forged", g: g, out: out}
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "notify", argo.PhaseSucceeded)
	waitFor(t, "the guard's store to hold the completion", func() bool { return r.metric(t, `exit_guard_store_records{state="terminal"}`) >= 1 })
	p.HangReads.Store(true)

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.WebhookCAData)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: burst,
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	url := "https://" + net.JoinHostPort(env.WebhookHost, port) + webhook.ValidatePath
	var wg sync.WaitGroup
	var answered atomic.Int64
	for i := range burst {
		wg.Go(func() {
			resp, err := hc.Post(url, "application/json", bytes.NewReader(forgedReview(fixture.ExitPod(wf), "forged-"+strconv.Itoa(i))))
			if err != nil {
				t.Errorf("forged review %d: %v", i, err)
				return
			}
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				answered.Add(1)
			}
		})
	}
	wg.Wait()
	shed := r.metric(t, `exit_guard_live_read_failures_total{kind="shed"}`)
	t.Logf("%d forged reviews answered; %v shed; %d live-read requests reached the hanging API server", answered.Load(), shed, p.Hung.Load())
	if answered.Load() != burst {
		t.Errorf("%d of %d reviews answered", answered.Load(), burst)
	}
	// Each decision that holds a slot makes at most 8 attempts (maxLiveReadAttempts).
	if hung := p.Hung.Load(); hung == 0 || hung > slots*8 {
		t.Errorf("%d live-read requests reached the API server for %d reviews, want between 1 and %d (%d decisions of at most 8 attempts)", hung, burst, slots*8, slots)
	}
	if shed < burst-2*slots {
		t.Errorf("%v decisions shed, want at least %d of %d: the others found the %d slots taken", shed, burst-2*slots, burst, slots)
	}
}
