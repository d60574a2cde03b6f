//go:build envtest

package chart

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// TestAFirstStartLogsNoError installs the chart's defaults (certificate mode self, two
// replicas) into an empty namespace and starts both replicas at once with the chart's
// permissions, as a first install does: they race to create the CA and the certificate, wait
// for the Secret's files, and write the caBundle. A clean start is no fault: neither log may
// hold an error line or a stack trace, which anyone grepping for errors would take for one.
// Each says why it is not ready yet, and then that it is.
func TestAFirstStartLogsNoError(t *testing.T) {
	ns := newNamespace(t, nil)
	objs := render(t, profiles[0], "first", ns)
	webhooks := install(t, objs)
	sa := only(t, objs, "ServiceAccount").GetName()
	secret := types.NamespacedName{Namespace: ns, Name: only(t, objs, "Secret").GetName()}
	registerAt(t, webhooks[0], "https://localhost:"+strconv.Itoa(env.WebhookPort), nil)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type replica struct {
		g   *testenv.Guard
		out *testenv.Output
	}
	var replicas []replica
	for i := range 2 {
		certDir := t.TempDir()
		mountSecret(ctx, t, secret, certDir)
		port := env.WebhookPort
		if i > 0 {
			p, err := testenv.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			port = p
		}
		out := &testenv.Output{}
		g, err := testenv.LaunchGuard(guardBin, kubeconfigAs(t, ns, sa), guardArgs(t, objs,
			"--webhook-port="+strconv.Itoa(port), "--webhook-cert-path="+certDir,
			"--cert-namespace="+ns, "--cert-extra-dns-names=localhost"), out)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		defer func() { _ = g.Stop() }()
		replicas = append(replicas, replica{g, out})
	}
	for i, r := range replicas {
		if err := r.g.WaitReady(ctx, 90*time.Second); err != nil {
			t.Fatalf("replica %d: %v\n%s", i, err, r.out)
		}
	}
	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	if err := env.Client.Create(t.Context(), fixture.ExitPod(done)); !contract.IsRefusal(err) {
		t.Errorf("the first replica does not refuse a stale pod: %v", err)
	}
	for i, r := range replicas {
		log := r.out.String()
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"stacktrace"`) || strings.Contains(line, "panic") {
				t.Errorf("replica %d logged on a clean first start: %s", i, line)
			}
		}
		if !strings.Contains(log, `"msg":"ready"`) {
			t.Errorf("replica %d did not say that it was ready:\n%s", i, log)
		}
	}
	// The first replica, probed from its start, said why it was not ready.
	if log := replicas[0].out.String(); !strings.Contains(log, `"msg":"not ready","check":`) {
		t.Errorf("replica 0 did not say why it was not ready:\n%s", log)
	}
}

// TestTheGuardSaysWhyTheAPIServerFailsOpen: with a caBundle that does not match the guard's
// certificate, the API server fails open on every call. The guard, with no access to the API
// server's log, counts the handshakes started and failed, by reason, and logs the reason Go's
// TLS stack was given; with the right caBundle, none fails.
func TestTheGuardSaysWhyTheAPIServerFailsOpen(t *testing.T) {
	ns := newNamespace(t, nil)
	objs := render(t, chartCerts, "open", ns)
	webhooks := install(t, objs)
	g, out := startChartGuard(t, ns, objs)
	url := "https://" + env.WebhookHost + ":" + strconv.Itoa(env.WebhookPort)
	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	stale := func() error { return env.Client.Create(t.Context(), fixture.ExitPod(done), client.DryRunAll) }
	counts := func() (started, failed float64) {
		mfs, err := g.Metrics(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		started, _ = sample(mfs, "exit_guard_webhook_tls_handshakes_started_total", nil)
		for _, r := range []string{"bad-certificate", "unknown-authority"} {
			v, _ := sample(mfs, "exit_guard_tls_handshake_errors_total", map[string]string{"reason": r})
			failed += v
		}
		return started, failed
	}

	registerAt(t, webhooks[0], url, env.WebhookCAData)
	if err := stale(); !contract.IsRefusal(err) {
		t.Fatalf("with the right caBundle the stale pod is not refused: %v", err)
	}
	started, failed := counts()
	if started < 1 || failed != 0 {
		t.Errorf("with the right caBundle: %v handshakes started, %v failed for the certificate; want at least one, and none", started, failed)
	}

	wrong := pointAt(t, webhooks[0], url, testenv.NewCA(t, "not the guard's CA").PEM)
	current := webhooks[0].DeepCopy()
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(current), current); err != nil {
		t.Fatal(err)
	}
	wrong.SetResourceVersion(current.GetResourceVersion())
	if err := env.Client.Update(t.Context(), wrong); err != nil {
		t.Fatal(err)
	}
	// The API server takes the new caBundle within moments: once a call fails open.
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return stale() == nil, nil
	}); err != nil {
		t.Fatalf("with a wrong caBundle the API server never failed open: %v", err)
	}
	started, failed = counts()
	for range 3 {
		if err := stale(); err != nil {
			t.Fatalf("with a wrong caBundle the API server should fail open: %v", err)
		}
	}
	started2, failed2 := counts()
	if started2-started < 3 || failed2-failed < 3 {
		t.Errorf("with a wrong caBundle: %v more handshakes started, %v more failed for the certificate; want at least 3 of each", started2-started, failed2-failed)
	}
	if log := out.String(); !strings.Contains(log, `"msg":"TLS handshake failed"`) || !strings.Contains(log, "remote error: tls:") {
		t.Errorf("the guard's log does not say the handshake failed, and why:\n%s", log)
	}
}
