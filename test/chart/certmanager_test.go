//go:build envtest && certmanager

package chart

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// certManagerErr is why the real cert-manager could not be found, said by the test that needs it.
var certManagerErr error

func init() {
	dir, err := testenv.CertManagerDir()
	if err != nil {
		certManagerErr = err
		return
	}
	extraCRDDirs = append(extraCRDDirs, filepath.Join(dir, "crds"))
}

var certificateGVK = schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Certificate"}

// injector is cert-manager's cainjector, which a test may stop and start again.
type injector struct {
	proc *testenv.Process
}

func (i *injector) stop(t *testing.T) {
	t.Helper()
	if err := i.proc.Stop(10 * time.Second); err != nil {
		t.Logf("stopping cainjector: %v", err)
	}
}

func (i *injector) start(t *testing.T) {
	t.Helper()
	p, err := i.proc.Again()
	if err != nil {
		t.Fatal(err)
	}
	i.proc = p
}

// startCertManager runs the real cert-manager's controller and cainjector against the test API
// server, as its administrator, until the test ends.
func startCertManager(t *testing.T) *injector {
	t.Helper()
	if certManagerErr != nil {
		t.Fatal(certManagerErr)
	}
	dir, err := testenv.CertManagerDir()
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	inj := &injector{}
	for _, part := range []string{"controller", "cainjector"} {
		out := &testenv.Output{}
		p, err := testenv.Launch(filepath.Join(dir, "cert-manager"), []string{part, "--kubeconfig=" + kc}, nil, out)
		if err != nil {
			t.Fatal(err)
		}
		stop := func() { _ = p.Stop(10 * time.Second) }
		if part == "cainjector" {
			inj.proc = p
			stop = func() { _ = inj.proc.Stop(10 * time.Second) }
		}
		t.Cleanup(func() {
			stop()
			if t.Failed() {
				t.Logf("cert-manager %s said:\n%s", part, out)
			}
		})
	}
	return inj
}

// renewal is what a run of certificate renewals under admission load saw.
type renewal struct {
	renewals int
	// served: the serving certificates the guard presented; caBundles: the caBundles the
	// API server held.
	served, caBundles int
	// probes of the guard's certificate against the live caBundle, those that did not verify,
	// and the longest run of them.
	probes, disagreed int
	longest           time.Duration
	// stale exit-handler pods sent, refused, admitted (a webhook call that failed, with the
	// chart's failurePolicy Ignore) and failed otherwise.
	sent, refused, admitted, failed int
}

func (r renewal) String() string {
	return fmt.Sprintf("%d renewals: %d serving certificates, %d caBundles; %d probes, %d disagreed (longest %s); %d stale pods sent, %d refused, %d admitted, %d failed",
		r.renewals, r.served, r.caBundles, r.probes, r.disagreed, r.longest.Round(time.Millisecond), r.sent, r.refused, r.admitted, r.failed)
}

// renewUnderLoad installs the chart in cert-manager mode with set, runs the guard as its
// Deployment would on the certificate cert-manager issues (the Secret brought to its folder as
// the kubelet brings a Secret volume), calls it through the rendered webhook configuration
// (the caBundle cainjector writes, the Service routed to an EndpointSlice of this machine),
// then has cert-manager renew the serving certificate n times (as `cmctl renew` asks it)
// while stale exit-handler pods are sent throughout and the guard's certificate is checked
// against the live caBundle every 50 ms. The last renewal comes while cainjector is down (a
// restart, a slow rollout): it starts again 3 s after the guard serves the new certificate.
func renewUnderLoad(t *testing.T, inj *injector, n int, before func(ns string), set ...string) renewal {
	t.Helper()
	ns := newNamespace(t, nil)
	if before != nil {
		before(ns)
	}
	objs := render(t, profile{name: "cert-manager", set: append([]string{"certificates.mode=cert-manager"}, set...)}, "cm", ns)
	webhooks := install(t, objs)
	svc := only(t, objs, "Service")
	var serving *unstructured.Unstructured
	for _, c := range find(objs, "Certificate") {
		if strings.HasSuffix(c.GetName(), "-webhook") {
			serving = c
		}
	}
	if serving == nil {
		t.Fatal("the chart renders no serving Certificate")
	}
	secretName, _, _ := unstructured.NestedString(serving.Object, "spec", "secretName")
	secret := types.NamespacedName{Namespace: ns, Name: secretName}
	serverName := svc.GetName() + "." + ns + ".svc"

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	waitFor(t, "cert-manager to issue the serving certificate", 2*time.Minute, func(ctx context.Context) bool {
		var s corev1.Secret
		return env.Client.Get(ctx, secret, &s) == nil && len(s.Data["tls.crt"]) > 0 && len(s.Data["ca.crt"]) > 0
	})
	certDir := t.TempDir()
	mountSecret(ctx, t, secret, certDir)
	waitFor(t, "the Secret's files", 10*time.Second, func(context.Context) bool {
		_, err := os.Stat(filepath.Join(certDir, "tls.crt"))
		return err == nil
	})
	addr, _, out := serveThroughService(ctx, t, objs, certDir)
	var vwc *unstructured.Unstructured
	for _, wh := range webhooks {
		wh := wh.DeepCopy()
		if err := env.Client.Create(t.Context(), wh); err != nil {
			t.Fatalf("registering %s: %v", wh.GetName(), err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), wh) })
		if wh.GetKind() == "ValidatingWebhookConfiguration" {
			vwc = wh
		}
	}
	caBundle := func() []byte {
		live := liveObject(t, vwc)
		hooks, _, _ := unstructured.NestedSlice(live.Object, "webhooks")
		ca, _, _ := unstructured.NestedString(hooks[0].(map[string]any), "clientConfig", "caBundle")
		pem, err := base64.StdEncoding.DecodeString(ca)
		if err != nil {
			t.Fatalf("the caBundle of %s is not base64: %v", vwc.GetName(), err)
		}
		return pem
	}
	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	send := func() error { return env.Client.Create(t.Context(), fixture.ExitPod(done), client.DryRunAll) }
	waitFor(t, "cainjector's caBundle and the guard's first refusal", 2*time.Minute, func(context.Context) bool {
		return len(caBundle()) > 0 && contract.IsRefusal(send())
	})

	var r renewal
	bundles, served := map[string]bool{}, map[string]bool{}
	var since time.Time // the start of the current run of probes that disagree
	lastRenewal, lastChange := time.Now(), time.Now()
	injectorDown := false
	defer func() {
		if injectorDown {
			inj.start(t)
		}
	}()
	// One probe and one stale pod each 50 ms, until the run ends or its deadline passes (then
	// the count of serving certificates below says what was missing).
	_ = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, time.Duration(n)*40*time.Second+time.Minute, true, func(context.Context) (bool, error) {
		// The next renewal 3 s after the guard serves the last one's certificate (it takes a
		// changed file up within its watcher's 10 s poll); 5 s without a change ends the run.
		if r.renewals < n && len(served) == r.renewals+1 && time.Since(lastChange) > 3*time.Second {
			if r.renewals == n-1 {
				inj.stop(t)
				injectorDown = true
			}
			renewCertificate(t, ns, serving.GetName())
			r.renewals++
			lastRenewal = time.Now()
		}
		if injectorDown && len(served) == n+1 && time.Since(lastChange) > 3*time.Second {
			inj.start(t)
			injectorDown = false
		}
		if r.renewals == n && !injectorDown && len(served) > n && time.Since(lastChange) > 5*time.Second && time.Since(lastRenewal) > 5*time.Second {
			return true, nil
		}
		ca := caBundle()
		if !bundles[string(ca)] {
			bundles[string(ca)], lastChange = true, time.Now()
		}
		r.probes++
		fp, trusted, err := presented(addr, serverName, ca)
		if err != nil {
			t.Fatalf("dialling the guard: %v", err)
		}
		if !served[fp] {
			served[fp], lastChange = true, time.Now()
		}
		if !trusted {
			r.disagreed++
			if since.IsZero() {
				since = time.Now()
			}
			r.longest = max(r.longest, time.Since(since))
		} else {
			since = time.Time{}
		}
		r.sent++
		switch err := send(); {
		case contract.IsRefusal(err):
			r.refused++
		case err == nil:
			r.admitted++
		default:
			r.failed++
			t.Logf("a stale pod's create failed: %v", err)
		}
		return false, nil
	})
	r.served, r.caBundles = len(served), len(bundles)
	if r.served <= n {
		t.Errorf("saw %d serving certificates after %d renewals, want %d: cert-manager did not renew, or the guard did not take the new one up\nthe guard said:\n%s", r.served, n, n+1, out)
	}
	return r
}

// presented returns the fingerprint of the certificate the guard presents for serverName, and
// whether caBundle verifies it: whether a new connection of the API server's would.
func presented(addr, serverName string, caBundle []byte) (string, bool, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr,
		&tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12, InsecureSkipVerify: true}) //nolint:gosec // G402: verified below against the caBundle
	if err != nil {
		return "", false, err
	}
	defer func() { _ = conn.Close() }()
	certs := conn.ConnectionState().PeerCertificates
	sum := sha256.Sum256(certs[0].Raw)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caBundle)
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, verr := certs[0].Verify(x509.VerifyOptions{DNSName: serverName, Roots: pool, Intermediates: inter})
	return hex.EncodeToString(sum[:]), verr == nil, nil
}

// renewCertificate asks cert-manager to issue the Certificate again now, as `cmctl renew`
// does: the Issuing condition, True, on its status.
func renewCertificate(t *testing.T, ns, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		c := &unstructured.Unstructured{}
		c.SetGroupVersionKind(certificateGVK)
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, c); err != nil {
			return false, nil //nolint:nilerr // retried until the deadline
		}
		conds, _, _ := unstructured.NestedSlice(c.Object, "status", "conditions")
		for _, cond := range conds {
			if m := cond.(map[string]any); m["type"] == "Issuing" && m["status"] == "True" {
				return false, nil // the last renewal is still under way
			}
		}
		conds = append(conds, map[string]any{"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
			"message": "Certificate re-issuance manually triggered", "observedGeneration": c.GetGeneration(),
			"lastTransitionTime": time.Now().UTC().Format(time.RFC3339)})
		if err := unstructured.SetNestedSlice(c.Object, conds, "status", "conditions"); err != nil {
			return false, err
		}
		return env.Client.Status().Update(ctx, c) == nil, nil
	})
	if err != nil {
		t.Fatalf("asking cert-manager to renew %s: %v", name, err)
	}
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func(context.Context) bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		return cond(ctx), nil
	}); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// TestCertManagerRenewsUnderOneCA runs the real cert-manager (make e2e-certmanager). With the
// chart's own CA, a renewal of the serving certificate keeps the caBundle: the API server and
// the guard agree at every probe, cainjector down or not, and no stale pod passes. The control
// is the serving certificate self-signed, as the chart made it before: its CA changes at every
// renewal, and while cainjector has not yet added the new one to the caBundle, the guard's new
// certificate is one the API server does not trust.
func TestCertManagerRenewsUnderOneCA(t *testing.T) {
	inj := startCertManager(t)
	const n = 3
	t.Run("the chart's CA", func(t *testing.T) {
		r := renewUnderLoad(t, inj, n, nil)
		t.Logf("the chart's CA: %s", r)
		if r.caBundles != 1 || r.disagreed != 0 || r.admitted != 0 || r.failed != 0 {
			t.Errorf("%s; want 1 caBundle, no probe that disagrees, no stale pod admitted or failed", r)
		}
	})
	t.Run("a self-signed serving certificate", func(t *testing.T) {
		r := renewUnderLoad(t, inj, n, func(ns string) {
			createOnce(t, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cert-manager.io/v1", "kind": "Issuer",
				"metadata": map[string]any{"namespace": ns, "name": "self-signed"}, "spec": map[string]any{"selfSigned": map[string]any{}}}})
		}, "certificates.certManager.issuerRef.name=self-signed", "certificates.certManager.issuerRef.kind=Issuer")
		t.Logf("a self-signed serving certificate: %s", r)
		if r.caBundles <= n || r.disagreed == 0 {
			t.Errorf("%s; want a new caBundle at each renewal, and a window while cainjector is down (the hazard the chart's CA removes)", r)
		}
	})
}
