//go:build envtest

package chart

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// mountSecret does what the kubelet does for a Secret volume: it writes the Secret's keys into
// dir and rewrites them whenever the Secret changes, all keys switching at once (each file is a
// link through the "..data" link, which is replaced by a rename, as the kubelet's atomic writer
// does).
func mountSecret(ctx context.Context, t *testing.T, key types.NamespacedName, dir string) {
	t.Helper()
	write := func(s *corev1.Secret) error {
		gen, err := os.MkdirTemp(dir, "..gen-")
		if err != nil {
			return err
		}
		for name, data := range s.Data {
			if err := os.WriteFile(filepath.Join(gen, name), data, 0o600); err != nil {
				return err
			}
		}
		tmp := filepath.Join(dir, "..data_tmp")
		_ = os.Remove(tmp)
		if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			return err
		}
		for name := range s.Data {
			link := filepath.Join(dir, name)
			if _, err := os.Lstat(link); os.IsNotExist(err) {
				if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
					return err
				}
			}
		}
		return nil
	}
	go func() {
		var lastRV string
		for ctx.Err() == nil {
			var s corev1.Secret
			if err := env.Client.Get(ctx, key, &s); err == nil && s.ResourceVersion != lastRV && len(s.Data["tls.crt"]) > 0 {
				if err := write(&s); err != nil {
					t.Errorf("mounting the Secret: %v", err)
					return
				}
				lastRV = s.ResourceVersion
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
}

// servedCert returns the fingerprint of the certificate the guard serves for serverName,
// verified against the caBundle of its webhook configuration. (Not the serial number: the
// rotator gives every serving certificate serial 1.)
func servedCert(addr, serverName string, caBundle []byte) (string, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caBundle) {
		return "", errors.New("no CA in the caBundle")
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12})
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	sum := sha256.Sum256(conn.ConnectionState().PeerCertificates[0].Raw)
	return hex.EncodeToString(sum[:]), nil
}

// TestSelfManagedCertificateRotatesUnderLoad runs the guard in certificate mode "self" with
// the chart's permissions, renewing its serving certificate every two seconds, while the API
// server keeps sending it admissions: every stale pod must be refused (the webhook fails open,
// so a failed call would show as an admitted pod) across several certificates.
func TestSelfManagedCertificateRotatesUnderLoad(t *testing.T) {
	ns := newNamespace(t, nil)
	objs := render(t, profiles[0], "rot", ns)
	webhooks := install(t, objs)
	sa := only(t, objs, "ServiceAccount").GetName()
	secret := types.NamespacedName{Namespace: ns, Name: only(t, objs, "Secret").GetName()}

	// The webhook configuration as rendered, with no caBundle: the guard writes it.
	registerAt(t, webhooks[0], "https://localhost:"+strconv.Itoa(env.WebhookPort), nil)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	certDir := t.TempDir()
	mountSecret(ctx, t, secret, certDir)

	out := &testenv.Output{}
	g, err := testenv.StartGuard(ctx, guardBin, kubeconfigAs(t, ns, sa), guardArgs(t, objs,
		"--webhook-port="+strconv.Itoa(env.WebhookPort), "--webhook-cert-path="+certDir,
		"--cert-namespace="+ns,
		// The API server reaches the test process as localhost, not through the Service.
		"--cert-extra-dns-names=localhost",
		// Certificates valid for an hour, renewed when less than 59m57s remain: a new one about
		// every 3 s, checked every second.
		"--server-cert-duration=1h", "--cert-lookahead=59m57s", "--cert-check-frequency=1s"), out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	defer func() { _ = g.Stop() }()

	caBundle := func() []byte {
		wh := webhooks[0].DeepCopy()
		if err := env.Client.Get(t.Context(), types.NamespacedName{Name: wh.GetName()}, wh); err != nil {
			t.Fatal(err)
		}
		hooks, _, _ := unstructured.NestedSlice(wh.Object, "webhooks")
		ca, _, _ := unstructured.NestedString(hooks[0].(map[string]any), "clientConfig", "caBundle")
		pem, err := base64.StdEncoding.DecodeString(ca)
		if err != nil || len(pem) == 0 {
			t.Fatalf("the guard wrote no caBundle (%v)", err)
		}
		return pem
	}()

	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	addr := "127.0.0.1:" + strconv.Itoa(env.WebhookPort)
	certs := map[string]bool{}
	attempts, refused := 0, 0
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) || len(certs) < 3 {
		if time.Now().After(deadline.Add(45 * time.Second)) {
			break
		}
		attempts++
		err := env.Client.Create(t.Context(), fixture.ExitPod(done))
		switch {
		case contract.IsRefusal(err):
			refused++
		case err == nil:
			t.Errorf("attempt %d: a stale pod was admitted: the webhook call failed", attempts)
		default:
			t.Errorf("attempt %d: %v", attempts, err)
		}
		if s, err := servedCert(addr, "localhost", caBundle); err == nil {
			certs[s] = true
		} else {
			t.Errorf("the served certificate does not verify against the caBundle: %v", err)
		}
	}
	t.Logf("%d admissions, %d refused, %d serving certificates seen", attempts, refused, len(certs))
	if len(certs) < 3 {
		t.Errorf("saw %d serving certificates, want rotation to at least 3\n%s", len(certs), out)
	}
	if refused != attempts {
		t.Errorf("%d of %d stale pods refused, want all", refused, attempts)
	}
	// It did all that with the chart's RBAC, which names its own Secret and webhook
	// configuration: nothing else of either kind.
	checkPermissions(t, ns, sa, out)
	checkCertPermissions(t, ns, sa, secret.Name, webhooks[0].GetName())
}

// TestSidecarSelfModeGrantsArgoOnlyWhatTheGuardNeeds: in sidecar mode the chart binds the
// guard's permissions to Argo's controller ServiceAccount, which runs in the namespace of
// Argo's own Secrets. With self-managed certificates, it gains the guard's own Secret and
// webhook configuration by name, and nothing more.
func TestSidecarSelfModeGrantsArgoOnlyWhatTheGuardNeeds(t *testing.T) {
	ns := newNamespace(t, nil)
	objs := render(t, profile{name: "sidecar", set: []string{"installMode=sidecar"}}, "exit-guard", ns)
	webhooks := install(t, objs)
	sa := "argo-workflows-workflow-controller"
	checkPermissions(t, ns, sa, &testenv.Output{})
	checkCertPermissions(t, ns, sa, only(t, objs, "Secret").GetName(), webhooks[0].GetName())
}

// checkCertPermissions checks, with SubjectAccessReviews, that the ServiceAccount may read and
// update its own certificate Secret and webhook configuration, by name, and no other.
func checkCertPermissions(t *testing.T, ns, sa, secret, webhook string) {
	t.Helper()
	user := "system:serviceaccount:" + ns + ":" + sa
	secrets := func(verb, name string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Resource: "secrets", Verb: verb, Namespace: ns, Name: name}
	}
	vwcs := func(verb, name string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations", Verb: verb, Name: name}
	}
	for _, tc := range []struct {
		attrs authorizationv1.ResourceAttributes
		want  bool
	}{
		{secrets("get", secret), true},
		{secrets("update", secret), true},
		{secrets("list", secret), true}, // a list with a metadata.name field selector
		{secrets("watch", secret), true},
		{secrets("get", "argo-server-sso"), false},
		{secrets("update", "argo-workflows-agent-ca-certificates"), false},
		{secrets("list", ""), false},
		{secrets("watch", ""), false},
		{secrets("create", ""), false},
		{secrets("delete", secret), false},
		{vwcs("update", webhook), true},
		{vwcs("list", webhook), true},
		{vwcs("update", "gatekeeper-validating-webhook-configuration"), false},
		{vwcs("list", ""), false},
		{vwcs("delete", webhook), false},
		{authorizationv1.ResourceAttributes{Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations", Verb: "update", Name: "istio-sidecar-injector"}, false},
	} {
		if allowed := serviceAccountMay(t, user, ns, tc.attrs); allowed != tc.want {
			t.Errorf("%s %s %q in %q: allowed = %v, want %v", tc.attrs.Verb, tc.attrs.Resource, tc.attrs.Name, tc.attrs.Namespace, allowed, tc.want)
		}
	}
}

// TestChartCertificateSurvivesUpgrade installs the chart (certificates.mode=chart) with helm
// into the test API server, upgrades it with other values, and checks that the Secret and the
// caBundle did not change: a new CA on upgrade would break admission until every guard pod
// reloads. Two renders with no cluster give two CAs, so what keeps it is the chart's lookup of
// the installed Secret (and why chart mode is not for `helm template`: see gitops_test.go).
func TestChartCertificateSurvivesUpgrade(t *testing.T) {
	ns := newNamespace(t, nil)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	helmArgs := func(args ...string) []string {
		return append(args, "--kubeconfig", kc, "--namespace", ns)
	}
	state := func() (secret map[string][]byte, caBundle []byte) {
		var s corev1.Secret
		if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "up-exit-guard-webhook-tls"}, &s); err != nil {
			t.Fatal(err)
		}
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		if err := env.Client.Get(t.Context(), types.NamespacedName{Name: "up-exit-guard"}, &vwc); err != nil {
			t.Fatal(err)
		}
		return s.Data, vwc.Webhooks[0].ClientConfig.CABundle
	}
	runHelm(t, helmArgs("install", "up", chartDir, "--set", "certificates.mode=chart")...)
	t.Cleanup(func() { runHelm(t, helmArgs("uninstall", "up")...) })
	secret1, ca1 := state()
	runHelm(t, helmArgs("upgrade", "up", chartDir, "--set", "certificates.mode=chart", "--set", "logging.level=debug", "--set", "replicaCount=3")...)
	secret2, ca2 := state()
	if diff := cmp.Diff(secret1, secret2); diff != "" {
		t.Errorf("helm upgrade changed the certificate Secret (-before +after):\n%s", diff)
	}
	if !bytes.Equal(ca1, ca2) || !bytes.Equal(ca1, secret1["ca.crt"]) {
		t.Error("helm upgrade changed the caBundle, or it is not the Secret's CA")
	}
	var dep appsv1.Deployment
	if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "up-exit-guard"}, &dep); err != nil || *dep.Spec.Replicas != 3 {
		t.Errorf("the upgrade did not apply: replicas %v, err %v", dep.Spec.Replicas, err)
	}

	// The control: without an installed Secret to look up, each render makes a new CA.
	a := only(t, render(t, chartCerts, "up", "elsewhere"), "Secret").Object["data"]
	b := only(t, render(t, chartCerts, "up", "elsewhere"), "Secret").Object["data"]
	if cmp.Equal(a, b) {
		t.Error("two renders with no cluster made the same certificate: the test proves nothing")
	}
}
