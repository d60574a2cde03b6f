//go:build envtest

package chart

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/itchyny/gojq"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// TestTwoRendersAreIdentical: Argo CD and Flux render the chart with `helm template`, where
// Helm's lookup finds nothing. Every profile whose certificates do not come from the chart
// itself must render the same bytes twice, or each sync would change the installed objects.
func TestTwoRendersAreIdentical(t *testing.T) {
	for _, p := range profiles {
		if strings.Contains(strings.Join(p.set, " "), "certificates.mode=chart") {
			continue // a new CA on every render without a cluster: helm install/upgrade only
		}
		t.Run(p.name, func(t *testing.T) {
			args := append([]string{"template", "exit-guard", chartDir, "--namespace", "argo", "--kube-version", testenv.KubeVersion()}, p.args()...)
			first, second := runHelm(t, args...), runHelm(t, args...)
			if !bytes.Equal(first, second) {
				t.Errorf("two renders differ:\n%s", lineDiff(first, second))
			}
		})
	}
}

// lineDiff lists the lines of a that b lacks and the other way round.
func lineDiff(a, b []byte) string {
	count := func(s []byte) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(string(s), "\n") {
			m[l]++
		}
		return m
	}
	ca, cb := count(a), count(b)
	var out strings.Builder
	for l, n := range ca {
		if cb[l] < n {
			fmt.Fprintf(&out, "- %s\n", l)
		}
	}
	for l, n := range cb {
		if ca[l] < n {
			fmt.Fprintf(&out, "+ %s\n", l)
		}
	}
	return out.String()
}

// application is the part of examples/argocd-application.yaml the test reads.
type application struct {
	Spec struct {
		Source struct {
			RepoURL        string `json:"repoURL"`
			TargetRevision string `json:"targetRevision"`
			Path           string `json:"path"`
			Helm           struct {
				ReleaseName string `json:"releaseName"`
			} `json:"helm"`
		} `json:"source"`
		IgnoreDifferences []struct {
			Group             string   `json:"group"`
			Kind              string   `json:"kind"`
			Name              string   `json:"name"`
			JSONPointers      []string `json:"jsonPointers"`
			JQPathExpressions []string `json:"jqPathExpressions"`
		} `json:"ignoreDifferences"`
		SyncPolicy struct {
			SyncOptions []string `json:"syncOptions"`
		} `json:"syncPolicy"`
	} `json:"spec"`
}

func readApplication(t *testing.T) application {
	t.Helper()
	var app application
	readExample(t, "argocd-application.yaml", &app, func(raw []byte, v any) error { return yaml.Unmarshal(raw, v) })
	// The released chart: the registry the release workflow pushes to, at the chart's version.
	src := app.Spec.Source
	if src.RepoURL != releasedChart || src.Path != "." || src.TargetRevision != chartVersion(t) || src.Helm.ReleaseName == "" {
		t.Fatalf("examples/argocd-application.yaml installs %s path %q at %q as %q, want %s path \".\" at the chart's version %s under a release name",
			src.RepoURL, src.Path, src.TargetRevision, src.Helm.ReleaseName, releasedChart, chartVersion(t))
	}
	if !contains(app.Spec.SyncPolicy.SyncOptions, "RespectIgnoreDifferences=true") {
		t.Error("examples/argocd-application.yaml lacks RespectIgnoreDifferences=true: a sync would write over the caBundle")
	}
	return app
}

// withoutIgnored is obj with the fields the Application's ignoreDifferences name removed, as
// Argo CD removes them before it compares.
func (app application) withoutIgnored(t *testing.T, obj *unstructured.Unstructured) map[string]any {
	t.Helper()
	raw, err := json.Marshal(obj.Object)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any // numbers as float64, which gojq takes
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, ig := range app.Spec.IgnoreDifferences {
		gvk := obj.GroupVersionKind()
		if ig.Group != gvk.Group || ig.Kind != gvk.Kind || (ig.Name != "" && ig.Name != obj.GetName()) {
			continue
		}
		var paths [][]any
		for _, expr := range ig.JQPathExpressions {
			q, err := gojq.Parse("path(" + expr + ")")
			if err != nil {
				t.Fatalf("jqPathExpression %q: %v", expr, err)
			}
			iter := q.Run(doc)
			for v, ok := iter.Next(); ok; v, ok = iter.Next() {
				if err, isErr := v.(error); isErr {
					t.Fatalf("jqPathExpression %q: %v", expr, err)
				}
				paths = append(paths, v.([]any))
			}
		}
		for _, p := range ig.JSONPointers {
			var path []any
			for _, tok := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
				if i, err := strconv.Atoi(tok); err == nil {
					path = append(path, i)
				} else {
					path = append(path, tok)
				}
			}
			paths = append(paths, path)
		}
		for _, p := range paths {
			deletePath(doc, p)
		}
	}
	return doc
}

func deletePath(doc any, path []any) {
	for i, step := range path {
		last := i == len(path)-1
		switch node := doc.(type) {
		case map[string]any:
			key, _ := step.(string)
			if last {
				delete(node, key)
				return
			}
			doc = node[key]
		case []any:
			idx, ok := step.(int)
			if !ok || idx >= len(node) {
				return
			}
			if last {
				return // Argo CD does not remove list items this way; no recipe asks it
			}
			doc = node[idx]
		default:
			return
		}
	}
}

// missing lists the fields of want that got lacks or holds with another value.
func missing(want, got any, at string) []string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{at}
		}
		var out []string
		for k, v := range w {
			out = append(out, missing(v, g[k], at+"."+k)...)
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{at}
		}
		var out []string
		for i := range w {
			out = append(out, missing(w[i], g[i], fmt.Sprintf("%s[%d]", at, i))...)
		}
		return out
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) {
			return []string{fmt.Sprintf("%s: want %v, live %v", at, want, got)}
		}
		return nil
	}
}

// TestGitOpsSyncSettlesAroundTheGuard plays Argo CD with examples/argocd-application.yaml: it
// renders the chart's defaults with `helm template`, applies them server-side (its
// ServerSideApply sync option), runs the guard with the chart's permissions as it writes its
// CA and certificate, renders and applies again (the next sync), and checks that the guard's
// writes survived, that it still refuses a stale exit handler, and that with the
// Application's ignoreDifferences every applied field matches the live objects: the app is
// in sync and stays so.
func TestGitOpsSyncSettlesAroundTheGuard(t *testing.T) {
	app := readApplication(t)
	release := app.Spec.Source.Helm.ReleaseName
	ns := newNamespace(t, nil)
	url := "https://localhost:" + strconv.Itoa(env.WebhookPort)
	// What a sync applies: the rendered objects but Helm's test hooks (which Argo CD does not
	// sync), the webhooks pointed at the test process (which the API server cannot reach
	// through the Service), the Deployment run by the test.
	desired := func(set ...string) (objs, applied []*unstructured.Unstructured) {
		objs = render(t, profile{name: "gitops", set: set}, release, ns)
		for _, o := range objs {
			if isTestHook(o) {
				continue
			}
			switch o.GetKind() {
			case "Deployment", "PodDisruptionBudget":
			case "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration":
				applied = append(applied, pointAt(t, o, url, nil))
			default:
				applied = append(applied, o.DeepCopy())
			}
		}
		return objs, applied
	}
	sync := func(applied []*unstructured.Unstructured) {
		for _, o := range applied {
			if err := env.Client.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(o.DeepCopy()),
				client.FieldOwner("argocd-controller"), client.ForceOwnership); err != nil {
				t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			obj := o
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
		}
	}
	live := func(o *unstructured.Unstructured) *unstructured.Unstructured {
		l := &unstructured.Unstructured{}
		l.SetGroupVersionKind(o.GroupVersionKind())
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(o), l); err != nil {
			t.Fatal(err)
		}
		return l
	}

	objs, applied := desired()
	sync(applied)
	sa := only(t, objs, "ServiceAccount").GetName()
	secret := only(t, objs, "Secret")
	var webhookCfg *unstructured.Unstructured
	for _, o := range applied {
		if strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
			webhookCfg = o
		}
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	certDir := t.TempDir()
	mountSecret(ctx, t, types.NamespacedName{Namespace: ns, Name: secret.GetName()}, certDir)
	out := &testenv.Output{}
	g, err := testenv.StartGuard(ctx, guardBin, kubeconfigAs(t, ns, sa), guardArgs(t, objs,
		"--webhook-port="+strconv.Itoa(env.WebhookPort), "--webhook-cert-path="+certDir,
		"--cert-namespace="+ns, "--cert-extra-dns-names=localhost"), out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	defer func() { _ = g.Stop() }()

	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	refused := func(when string) {
		err := env.Client.Create(t.Context(), fixture.ExitPod(done))
		if !contract.IsRefusal(err) {
			t.Errorf("%s: stale exit-handler pod: err = %v, want refused\n%s", when, err, out)
		}
	}
	refused("after the first sync")
	before := map[string]*unstructured.Unstructured{"secret": live(secret), "webhook": live(webhookCfg)}
	caBundle, _, _ := unstructured.NestedSlice(before["webhook"].Object, "webhooks")
	for i, w := range caBundle {
		if ca, _, _ := unstructured.NestedString(w.(map[string]any), "clientConfig", "caBundle"); ca == "" {
			t.Fatalf("the guard wrote no caBundle into webhook %d of %s", i, webhookCfg.GetName())
		} else if pem, _ := base64.StdEncoding.DecodeString(ca); !bytes.Contains(pem, []byte("BEGIN CERTIFICATE")) {
			t.Fatalf("webhook %d of %s: the caBundle holds no certificate", i, webhookCfg.GetName())
		}
	}

	// The next sync: a new render, applied over what the guard wrote.
	_, again := desired()
	sync(again)
	for name, b := range before {
		a := live(b)
		switch name {
		case "secret":
			if !reflect.DeepEqual(b.Object["data"], a.Object["data"]) {
				t.Error("the second sync changed the certificate Secret's data")
			}
		case "webhook":
			if !reflect.DeepEqual(b.Object["webhooks"], a.Object["webhooks"]) {
				t.Error("the second sync changed the webhooks (their caBundle)")
			}
		}
	}
	refused("after the second sync")

	checkInSync(t, app, again, live)

	// The kill switch from Git: a commit of webhook.enabled=false. Argo CD syncs it and prunes
	// what the render no longer has: the webhook configuration. The Deployment rolls to the
	// new arguments (the test restarts the guard with them): it runs and stays ready, naming no
	// configuration, and every stale pod is admitted, as before the install. Then a commit of
	// true brings the configuration back, and the guard refuses again.
	switchTo := func(enabled bool) *testenv.Guard {
		t.Helper()
		objs, applied := desired("webhook.enabled=" + strconv.FormatBool(enabled))
		sync(applied)
		prune(t, again, applied)
		again = applied
		if err := g.Stop(); err != nil {
			t.Logf("stopping the guard: %v", err)
		}
		out = &testenv.Output{}
		g, err = testenv.StartGuard(ctx, guardBin, kubeconfigAs(t, ns, sa), guardArgs(t, objs,
			"--webhook-port="+strconv.Itoa(env.WebhookPort), "--webhook-cert-path="+certDir,
			"--cert-namespace="+ns, "--cert-extra-dns-names=localhost"), out)
		if err != nil {
			t.Fatalf("webhook.enabled=%t: %v\n%s", enabled, err, out)
		}
		return g
	}
	g = switchTo(false)
	cfg := &unstructured.Unstructured{}
	cfg.SetGroupVersionKind(webhookCfg.GroupVersionKind())
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(webhookCfg), cfg); !apierrors.IsNotFound(err) {
		t.Errorf("webhook.enabled=false: the webhook configuration is still there (%v)", err)
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return env.Client.Create(t.Context(), fixture.ExitPod(done), client.DryRunAll) == nil, nil
	}); err != nil {
		t.Errorf("webhook.enabled=false: the stale pod is still refused: %v", err)
	}
	if code, err := g.Probe(t.Context(), "/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("webhook.enabled=false: the guard is not ready (%d, %v)\n%s", code, err, out)
	}
	if strings.Contains(out.String(), `"level":"error"`) {
		t.Errorf("webhook.enabled=false: the guard logs errors:\n%s", out)
	}
	checkInSync(t, app, again, live)
	g = switchTo(true)
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return contract.IsRefusal(env.Client.Create(t.Context(), fixture.ExitPod(done), client.DryRunAll)), nil
	}); err != nil {
		t.Errorf("webhook.enabled=true again: the stale pod is not refused: %v\n%s", err, out)
	}
	checkInSync(t, app, again, live)
}

// prune deletes what the last sync applied and the new render no longer has, as Argo CD's
// automated prune does.
func prune(t *testing.T, last, now []*unstructured.Unstructured) {
	t.Helper()
	keep := map[string]bool{}
	for _, o := range now {
		keep[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = true
	}
	for _, o := range last {
		if !keep[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] {
			if err := env.Client.Delete(t.Context(), o.DeepCopy()); err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("pruning %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}
}

// checkInSync is Argo CD's view: the live objects, less the Application's ignoreDifferences,
// hold every applied field, and nothing the guard wrote is left to differ.
func checkInSync(t *testing.T, app application, applied []*unstructured.Unstructured, live func(*unstructured.Unstructured) *unstructured.Unstructured) {
	t.Helper()
	again := applied
	for _, o := range again {
		l := app.withoutIgnored(t, live(o))
		want := app.withoutIgnored(t, o)
		for _, m := range missing(want, l, o.GetKind()+"/"+o.GetName()) {
			t.Errorf("out of sync: %s", m)
		}
		if o.GetKind() == "Secret" {
			if _, ok := l["data"]; ok {
				t.Errorf("the Application does not ignore the data the guard writes into Secret %s", o.GetName())
			}
		}
		if strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
			for i, w := range l["webhooks"].([]any) {
				if _, ok := w.(map[string]any)["clientConfig"].(map[string]any)["caBundle"]; ok {
					t.Errorf("the Application does not ignore the caBundle the guard writes into webhook %d of %s", i, o.GetName())
				}
			}
		}
	}
}

// releasedChart is where the release (hack/release.sh publish: registry ghcr.io/exit-guard, the
// chart under charts/) pushes the chart.
const releasedChart = "oci://ghcr.io/exit-guard/charts/exit-guard"

// chartVersion is the version in the chart's Chart.yaml: the version a release publishes.
func chartVersion(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Version string `json:"version"`
	}
	if err := yaml.Unmarshal(raw, &meta); err != nil || meta.Version == "" {
		t.Fatalf("Chart.yaml: no version (%v)", err)
	}
	return meta.Version
}
