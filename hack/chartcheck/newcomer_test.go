package chartcheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// TestAKindAddedInTheCodeIsServed: the chart serves every webhook make manifests generates,
// with no template edit. The chart is rendered with the generated manifests and, beside them,
// the webhook controller-gen makes of the marker of webhook/newcomer_test.go's test-only kind
// (PersistentVolumeClaim creates): served in enforce and warn mode, with its rules and match
// conditions, the chart's selectors and the pod webhook's failure policy and timeout, which its
// values (webhook.kinds.persistentvolumeclaim) change or turn off.
func TestAKindAddedInTheCodeIsServed(t *testing.T) {
	root := testenv.RepoRoot()
	chart := filepath.Join(t.TempDir(), "exit-guard")
	if err := os.CopyFS(chart, os.DirFS(filepath.Join(root, "charts", "exit-guard"))); err != nil {
		t.Fatal(err)
	}
	// As make manifests would write them: the newcomer's webhook among the validating ones.
	vwc, mwc, err := testenv.GeneratedWebhooks()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "webhook", "testdata", "newcomer-webhook.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var newcomer admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.Unmarshal(raw, &newcomer); err != nil || len(newcomer.Webhooks) != 1 {
		t.Fatalf("webhook/testdata/newcomer-webhook.yaml: %v, %d webhooks", err, len(newcomer.Webhooks))
	}
	vwc.Webhooks = append(vwc.Webhooks, newcomer.Webhooks...)
	var docs []string
	for _, c := range []any{mwc, vwc} {
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(out))
	}
	if err := os.WriteFile(filepath.Join(chart, "files", "webhook", "manifests.yaml"), []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	const name = "validate-persistentvolumeclaim.exit-guard.io"
	served := func(t *testing.T, set ...string) map[string]any {
		t.Helper()
		args := []string{"--kube-version", testenv.KubeVersion()}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		var found map[string]any
		for _, doc := range strings.Split(string(renderChart(t, chart, args...)), "\n---") {
			var c struct {
				Kind     string           `json:"kind"`
				Webhooks []map[string]any `json:"webhooks"`
			}
			if err := yaml.Unmarshal([]byte(doc), &c); err != nil {
				t.Fatal(err)
			}
			for _, w := range c.Webhooks {
				if w["name"] == name {
					if c.Kind != "ValidatingWebhookConfiguration" {
						t.Errorf("%s rendered in a %s", name, c.Kind)
					}
					found = w
				}
			}
		}
		return found
	}
	for _, mode := range []string{"enforce", "warn", "dry-run"} {
		t.Run(mode, func(t *testing.T) {
			w := served(t, "guard.mode="+mode)
			if w == nil {
				t.Fatalf("the chart does not serve %s in %s mode", name, mode)
			}
			path := w["clientConfig"].(map[string]any)["service"].(map[string]any)["path"]
			conds, _ := w["matchConditions"].([]any)
			var condNames []string
			for _, c := range conds {
				condNames = append(condNames, c.(map[string]any)["name"].(string))
			}
			if path != "/validate-persistentvolumeclaim" || w["failurePolicy"] != "Ignore" || w["timeoutSeconds"] != float64(5) ||
				!slices.Equal(condNames, []string{"owned-by-argo-workflow"}) || w["namespaceSelector"] == nil {
				t.Errorf("%s: path %v, failurePolicy %v, timeoutSeconds %v, matchConditions %v, namespaceSelector %v", name, path, w["failurePolicy"], w["timeoutSeconds"], condNames, w["namespaceSelector"])
			}
		})
	}
	t.Run("warn mode, the newcomer the only validating webhook", func(t *testing.T) {
		// The pods are marked; the TaskSet and Event webhooks are off: the guard still gets the
		// flag and the RBAC of the validating configuration that holds the newcomer's webhook.
		set := []string{"--kube-version", testenv.KubeVersion(), "--set", "guard.mode=warn", "--set", "webhook.taskSets.enabled=false", "--set", "webhook.events.enabled=false"}
		out := string(renderChart(t, chart, set...))
		if !strings.Contains(out, "name: "+name) {
			t.Fatalf("%s not rendered", name)
		}
		if !strings.Contains(out, "--validating-webhook-configuration=") {
			t.Errorf("the guard has no --validating-webhook-configuration flag: it would never write the caBundle of %s", name)
		}
		granted := false
		for _, doc := range strings.Split(out, "\n---") {
			var r struct {
				Kind  string `json:"kind"`
				Rules []struct {
					Resources []string `json:"resources"`
				} `json:"rules"`
			}
			if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
				t.Fatal(err)
			}
			for _, rule := range r.Rules {
				granted = granted || r.Kind == "ClusterRole" && slices.Contains(rule.Resources, "validatingwebhookconfigurations")
			}
		}
		if !granted {
			t.Errorf("no ClusterRole lets the guard update validatingwebhookconfigurations")
		}
	})
	t.Run("its values", func(t *testing.T) {
		w := served(t, "webhook.kinds.persistentvolumeclaim.failurePolicy=Fail", "webhook.kinds.persistentvolumeclaim.timeoutSeconds=3")
		if w == nil || w["failurePolicy"] != "Fail" || w["timeoutSeconds"] != float64(3) {
			t.Errorf("with its failure policy and timeout set: %v", w)
		}
		if w := served(t, "webhook.kinds.persistentvolumeclaim.enabled=false"); w != nil {
			t.Errorf("with enabled=false the chart still serves %s", name)
		}
	})
}
