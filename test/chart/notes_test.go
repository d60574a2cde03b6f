//go:build envtest

package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNotesTellWhatWasInstalledAndHowToCheckIt renders NOTES.txt (helm install --dry-run
// against the test API server) for several profiles: it names what was installed, gives the
// check command for this release and namespace, and says where refusals show.
func TestNotesTellWhatWasInstalledAndHowToCheckIt(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p    profile
		want []string
	}{
		{profile{name: "default"}, []string{
			"is installed in argo (standalone, mode enforce, certificates: self)",
			"helm test notes --namespace argo --logs",
			"Events tab", "--field-selector reason=ExitHandlerDenied",
			"kubectl logs -n argo deploy/notes-exit-guard",
			`exit_guard_decisions_total{verdict="denied"}`,
			"prometheusRule.enabled=true adds alerts",
			"guard.expectedRequester is not set: every refusal counts as a stale copy's",
		}},
		{profile{name: "expected requester", set: []string{"guard.expectedRequester=system:serviceaccount:argo:argo"}}, []string{
			"It expects them from system:serviceaccount:argo:argo (guard.expectedRequester)",
		}},
		{profile{name: "warn", set: []string{"guard.mode=warn", "prometheusRule.enabled=true", "image.repository=registry.example.com/platform/exit-guard"}}, []string{
			"mode warn", "reason=ExitHandlerWouldBeDenied", "kubectl get pods -A -l exit-guard.io/suspect",
			`exit_guard_decisions_total{verdict="warned"}`,
		}},
		{profile{name: "sidecar", set: []string{"installMode=sidecar"}}, []string{
			"(sidecar, mode enforce", "kubectl get configmap notes-exit-guard-sidecar --namespace argo", "argo-workflows-values", "-c exit-guard",
		}},
		{profile{name: "no helm test", set: []string{"check.enabled=false"}}, []string{
			"exit-guard check --namespace=argo", "may create pods in argo",
		}},
	} {
		t.Run(tc.p.name, func(t *testing.T) {
			args := append([]string{"install", "notes", chartDir, "--namespace", "argo", "--dry-run=client", "--kubeconfig", kc}, tc.p.args()...)
			out := string(runHelm(t, args...))
			_, notes, ok := strings.Cut(out, "\nNOTES:\n")
			if !ok {
				t.Fatalf("no NOTES in:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES lack %q:\n%s", w, notes)
				}
			}
			if strings.Contains(notes, "not published") {
				t.Errorf("NOTES call the image unpublished; the chart's default is the released one:\n%s", notes)
			}
		})
	}
}
