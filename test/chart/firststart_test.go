//go:build envtest

package chart

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

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
