//go:build envtest

package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// recipe returns the shell block of doc that follows the marker `<!-- recipe: name -->`,
// unindented: the docs' own commands, which the tests run as written.
func recipe(t *testing.T, doc, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), doc))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	marker := "<!-- recipe: " + name + " -->"
	at := strings.Index(text, marker)
	if at < 0 {
		t.Fatalf("%s has no %s: the recipe the test runs is gone", doc, marker)
	}
	m := regexp.MustCompile("(?s)\n( *)```sh\n(.*?)\n *```").FindStringSubmatch(text[at:])
	if m == nil {
		t.Fatalf("%s: no ```sh block after %s", doc, marker)
	}
	var lines []string
	for _, l := range strings.Split(m[2], "\n") {
		lines = append(lines, strings.TrimPrefix(l, m[1]))
	}
	return strings.Join(lines, "\n") + "\n"
}

// helmShell runs script with bash in dir, with the repository's helm as `helm` on the PATH, the
// test API server's kubeconfig and a Helm configuration of the test's own; vars replace the
// recipe's own assignments of the same names (NAME=value at the start of a line).
func helmShell(t *testing.T, dir, script string, vars map[string]string) (string, error) {
	t.Helper()
	bin := t.TempDir()
	if err := os.Symlink(helm(t), filepath.Join(bin, "helm")); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, value := range vars {
		re := regexp.MustCompile(`(?m)^` + name + `=\S*`)
		if !re.MatchString(script) {
			t.Fatalf("the recipe no longer sets %s:\n%s", name, script)
		}
		script = re.ReplaceAllLiteralString(script, name+"="+value)
	}
	cmd := exec.CommandContext(t.Context(), "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+kc,
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestSidecarRecipeKeepsArgosVersionAndLists runs docs/sidecar.md's recipe as written against
// a release of a stand-in for the argo-workflows chart (testdata/argo-workflows-standin) at
// 0.45.0 with a container and a volume of the user's, while the repository also serves 0.46.0:
// Argo's chart stays at 0.45.0, the user's entries stay, the guard's are added, and running the
// recipe again adds nothing.
func TestSidecarRecipeKeepsArgosVersionAndLists(t *testing.T) {
	ns := newNamespace(t, nil)
	repo := t.TempDir()
	for _, v := range []string{"0.45.0", "0.46.0"} {
		runHelm(t, "package", filepath.Join("testdata", "argo-workflows-standin"), "--version", v, "--destination", repo)
	}
	runHelm(t, "repo", "index", repo)
	srv := httptest.NewServer(http.FileServer(http.Dir(repo)))
	t.Cleanup(srv.Close)

	userValues := filepath.Join(t.TempDir(), "argo-values.yaml")
	if err := os.WriteFile(userValues, []byte(`controller:
  extraContainers:
    - name: log-shipper
      image: example/shipper:1
  volumes:
    - name: shipper-config
      configMap: {name: shipper}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	setup := `helm repo add argo ` + srv.URL + ` >/dev/null
helm install argo-workflows argo/argo-workflows --version 0.45.0 --namespace "$NAMESPACE" -f ` + userValues + "\n"
	steps := recipe(t, "docs/sidecar.md", "sidecar-upgrade")
	vars := map[string]string{"NAMESPACE": ns, "ARGO_RELEASE": "argo-workflows"}
	work := t.TempDir()
	if err := os.Symlink(filepath.Join(testenv.RepoRoot(), "charts"), filepath.Join(work, "charts")); err != nil {
		t.Fatal(err)
	}
	twice := "NAMESPACE=argo\n" + setup + steps + steps
	if out, err := helmShell(t, work, twice, vars); err != nil {
		t.Fatalf("the recipe failed: %v\n%s", err, out)
	}

	var dep appsv1.Deployment
	if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "argo-workflows-workflow-controller"}, &dep); err != nil {
		t.Fatal(err)
	}
	if v := dep.Labels["chart-version"]; v != "0.45.0" {
		t.Errorf("after the recipe Argo's chart is %s, want 0.45.0 (the repository serves 0.46.0: the recipe upgraded Argo)", v)
	}
	var containers, volumes []string
	for _, c := range dep.Spec.Template.Spec.Containers {
		containers = append(containers, c.Name)
	}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		volumes = append(volumes, v.Name)
	}
	if got, want := strings.Join(containers, ","), "controller,log-shipper,exit-guard"; got != want {
		t.Errorf("containers after the recipe, twice: %s, want %s", got, want)
	}
	if got, want := strings.Join(volumes, ","), "shipper-config,exit-guard-webhook-tls"; got != want {
		t.Errorf("volumes after the recipe, twice: %s, want %s", got, want)
	}
}

// TestUpgradeKeepsTheNewChartsDefaults upgrades a release of an older chart (this chart without
// the values and template of helm test, as before check existed) made with a value of the
// user's: docs/install.md's upgrade (--reset-then-reuse-values) renders the new chart with its
// new defaults and keeps the user's value, as does the values-file form it gives; the
// --reuse-values it replaced fails to render, which is why.
func TestUpgradeKeepsTheNewChartsDefaults(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	upgrade := regexp.MustCompile(`(?m)^helm upgrade exit-guard .*$`).FindAllString(string(doc), -1)
	if len(upgrade) == 0 || !strings.Contains(strings.Join(upgrade, "\n"), "--reset-then-reuse-values") || strings.Contains(string(doc), " --reuse-values") {
		t.Fatalf("docs/install.md's upgrade is not the one this test proves (helm upgrade ... --reset-then-reuse-values, never --reuse-values): %q", upgrade)
	}

	old := olderChart(t)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, form := range []string{"reset-then-reuse", "values-file", "reuse (the old recipe)"} {
		t.Run(form, func(t *testing.T) {
			ns := newNamespace(t, nil)
			// Each its own release name: the cluster-scoped objects are named by it.
			release := fmt.Sprintf("up%d", i)
			h := func(args ...string) ([]byte, error) {
				cmd := exec.CommandContext(t.Context(), helm(t), append(args, "--kubeconfig", kc, "--namespace", ns)...) //nolint:gosec // G204: the pinned helm of this repository
				return cmd.CombinedOutput()
			}
			if out, err := h("install", release, old, "--set", "replicaCount=3"); err != nil {
				t.Fatalf("installing the older chart: %v\n%s", err, out)
			}
			t.Cleanup(func() { _, _ = h("uninstall", release) })
			var out []byte
			switch form {
			case "reset-then-reuse":
				out, err = h("upgrade", release, chartDir, "--reset-then-reuse-values")
			case "values-file":
				var values []byte
				if values, err = h("get", "values", release, "--output", "yaml"); err != nil {
					t.Fatalf("helm get values: %v\n%s", err, values)
				}
				file := filepath.Join(t.TempDir(), "values.yaml")
				if err := os.WriteFile(file, values, 0o600); err != nil {
					t.Fatal(err)
				}
				out, err = h("upgrade", release, chartDir, "-f", file)
			default:
				out, err = h("upgrade", release, chartDir, "--reuse-values")
				if err == nil {
					t.Fatalf("--reuse-values upgraded a release of the chart without check: the older chart is not older, and the test proves nothing\n%s", out)
				}
				t.Logf("--reuse-values fails, as docs/install.md says: %s", bytes.TrimSpace(out))
				return
			}
			if err != nil {
				t.Fatalf("the upgrade failed: %v\n%s", err, out)
			}
			var dep appsv1.Deployment
			if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: release + "-exit-guard"}, &dep); err != nil {
				t.Fatal(err)
			}
			if *dep.Spec.Replicas != 3 {
				t.Errorf("the user's replicaCount=3 was lost: %d replicas", *dep.Spec.Replicas)
			}
			hooks, err := h("get", "hooks", release)
			if err != nil || !strings.Contains(string(hooks), "exit-guard-check") {
				t.Errorf("the new chart's default check.enabled=true did not apply (no helm test hook): %v\n%s", err, hooks)
			}
		})
	}
}

// olderChart is a copy of this chart as it was before helm test: no check values, schema or
// template (nor notes, which name them), version 0.0.9.
func olderChart(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "exit-guard")
	if out, err := exec.CommandContext(t.Context(), "cp", "-r", chartDir, dir).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, f := range []string{"tests/check.yaml", "NOTES.txt"} {
		if err := os.Remove(filepath.Join(dir, "templates", f)); err != nil {
			t.Fatal(err)
		}
	}
	edit := func(file string, change func(map[string]any)) {
		raw, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		change(doc)
		marshal := yaml.Marshal
		if strings.HasSuffix(file, ".json") {
			marshal = func(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }
		}
		out, err := marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), out, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	edit("values.yaml", func(v map[string]any) { delete(v, "check") })
	edit("values.schema.json", func(s map[string]any) { delete(s["properties"].(map[string]any), "check") })
	edit("Chart.yaml", func(c map[string]any) { c["version"] = "0.0.9" })
	return dir
}

// TestUninstallLeavesWhatTheDocsSay installs the chart with helm, runs helm test (no kubelet
// runs its pod here, so it times out, as a failed test would), uninstalls, and lists what is
// left of the release: only the test pod, which docs/install.md's uninstall table names (with
// the command that removes it); every cluster-scoped object of the release is gone.
func TestUninstallLeavesWhatTheDocsSay(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "| the `helm test` pod `exit-guard-check` |") {
		t.Fatal("docs/install.md's uninstall table no longer names the helm test pod: the test checks what it says")
	}
	ns := newNamespace(t, nil)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	h := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(t.Context(), helm(t), append(args, "--kubeconfig", kc, "--namespace", ns)...) //nolint:gosec // G204: the pinned helm of this repository
		return cmd.CombinedOutput()
	}
	const release = "exit-guard"
	if out, err := h("install", release, chartDir, "--set", "prometheusRule.enabled=false"); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	if out, err := h("test", release, "--timeout", "2s"); err == nil {
		t.Fatalf("helm test passed with no kubelet to run its pod: %s", out)
	}
	if out, err := h("uninstall", release); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	sel := client.MatchingLabels{"app.kubernetes.io/instance": release}
	var left []string
	for _, list := range []client.ObjectList{&corev1.PodList{}, &corev1.SecretList{}, &corev1.ServiceList{}, &corev1.ServiceAccountList{},
		&corev1.ConfigMapList{}, &appsv1.DeploymentList{}, &rbacv1.RoleList{}, &rbacv1.RoleBindingList{}} {
		if err := env.Client.List(t.Context(), list, client.InNamespace(ns), sel); err != nil {
			t.Fatal(err)
		}
		items, _ := meta.ExtractList(list)
		for _, o := range items {
			obj := o.(client.Object)
			left = append(left, fmt.Sprintf("%T %s", o, obj.GetName()))
		}
	}
	for _, list := range []client.ObjectList{&admissionregistrationv1.ValidatingWebhookConfigurationList{}, &admissionregistrationv1.MutatingWebhookConfigurationList{},
		&rbacv1.ClusterRoleList{}, &rbacv1.ClusterRoleBindingList{}, &admissionregistrationv1.ValidatingAdmissionPolicyList{}, &flowcontrolv1.FlowSchemaList{}} {
		if err := env.Client.List(t.Context(), list, sel); err != nil {
			t.Fatal(err)
		}
		items, _ := meta.ExtractList(list)
		for _, o := range items {
			left = append(left, fmt.Sprintf("%T %s", o, o.(client.Object).GetName()))
		}
	}
	if want := []string{"*v1.Pod exit-guard-check"}; !slices.Equal(left, want) {
		t.Errorf("left after helm uninstall: %v, want %v (the uninstall table of docs/install.md)", left, want)
	}
}
