//go:build envtest

package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// kubectlShell runs a recipe of the docs with bash, a real kubectl (built by
// hack/envtest-binaries.sh at the API server's version) as `kubectl` on the PATH, and the test
// API server's kubeconfig.
func kubectlShell(t *testing.T, script string) (string, error) {
	t.Helper()
	kubectl, err := testenv.KubectlBin()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(kubectl, filepath.Join(bin, "kubectl")); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "bash", "-euo", "pipefail", "-c", script)
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+kc)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// upstreamControllerDeployment is the workflow-controller Deployment of Argo's own manifests
// (manifests/base, which upstream's install.yaml is built from), read from Argo's Go module.
func upstreamControllerDeployment(t *testing.T) []byte {
	t.Helper()
	const mod = "github.com/argoproj/argo-workflows/v3@v3.4.17"
	cmd := exec.CommandContext(t.Context(), "go", "mod", "download", "-json", mod)
	cmd.Dir = t.TempDir()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s (it needs the Go module proxy, or the module in the module cache): %v", mod, err)
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %v\n%s", mod, err, out)
	}
	raw, err := os.ReadFile(filepath.Join(info.Dir, "manifests", "base", "workflow-controller", "workflow-controller-deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestTheDocsKubectlRecipes runs docs/install.md's kubectl recipes as written, with a real
// kubectl: finding Argo's controller's ServiceAccount (on upstream's Deployment and on
// argo-helm's shape), and turning the guard off in an emergency.
func TestTheDocsKubectlRecipes(t *testing.T) {
	t.Run("find-requester", func(t *testing.T) {
		upstream, helmNS := newNamespace(t, nil), newNamespace(t, nil)
		dep := decodeAll(t, upstreamControllerDeployment(t))[0]
		dep.SetNamespace(upstream)
		if err := env.Client.Create(t.Context(), dep); err != nil {
			t.Fatal(err)
		}
		// The argo-helm shape, with its naming rule: release aw gives the ServiceAccount
		// aw-argo-workflows-workflow-controller.
		rendered := decodeAll(t, runHelm(t, "template", "aw", filepath.Join("testdata", "argo-workflows-standin"), "--namespace", helmNS))
		for _, o := range rendered {
			o.SetNamespace(helmNS)
			if err := env.Client.Create(t.Context(), o); err != nil {
				t.Fatal(err)
			}
		}
		out, err := kubectlShell(t, recipe(t, "docs/install.md", "find-requester"))
		if err != nil {
			t.Fatalf("the recipe failed: %v\n%s", err, out)
		}
		for _, want := range []string{"system:serviceaccount:" + upstream + ":argo", "system:serviceaccount:" + helmNS + ":aw-argo-workflows-workflow-controller"} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("the recipe does not print %s:\n%s", want, out)
			}
		}
	})

	t.Run("emergency-off", func(t *testing.T) {
		ns := newNamespace(t, nil)
		// The release name the recipe names.
		objs := render(t, chartCerts, "exit-guard", ns)
		webhooks := install(t, objs)
		startChartGuard(t, ns, objs)
		url := fmt.Sprintf("https://%s:%d", env.WebhookHost, env.WebhookPort)
		registerAt(t, webhooks[0], url, env.WebhookCAData)
		done := createWorkflow(t, ns, argo.PhaseSucceeded)
		stale := func() error { return env.Client.Create(t.Context(), fixture.ExitPod(done), client.DryRunAll) }
		if err := stale(); !contract.IsRefusal(err) {
			t.Fatalf("before the recipe the guard does not refuse the stale pod: %v", err)
		}
		if out, err := kubectlShell(t, recipe(t, "docs/install.md", "emergency-off")); err != nil {
			t.Fatalf("the recipe failed: %v\n%s", err, out)
		}
		if err := stale(); err != nil {
			t.Errorf("right after the recipe the stale pod is still refused: %v", err)
		}
		// For 5 s, asked every 250 ms: nothing puts the configuration back.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if err := stale(); err != nil {
				t.Fatalf("after the recipe the stale pod is refused again (something put the configuration back): %v", err)
			}
			select {
			case <-t.Context().Done():
				t.Fatal(t.Context().Err())
			case <-time.After(250 * time.Millisecond):
			}
		}
		registerAt(t, webhooks[0], url, env.WebhookCAData)
		if err := stale(); !contract.IsRefusal(err) {
			t.Errorf("registered again, the guard does not refuse: %v", err)
		}
	})
}
