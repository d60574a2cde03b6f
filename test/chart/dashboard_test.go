//go:build envtest

package chart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

var dashboardFile = filepath.Join(chartDir, "files", "dashboards", "exit-guard.json")

// dashboardQueries returns the PromQL of every panel of the dashboard.
func dashboardQueries(t *testing.T, raw []byte) []string {
	t.Helper()
	type panel struct {
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []panel `json:"panels"` // a collapsed row holds its panels
	}
	var d panel
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	var exprs []string
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if len(exprs) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return exprs
}

var (
	quoted    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	matchers  = regexp.MustCompile(`\{[^}]*\}`)
	durations = regexp.MustCompile(`\[[^\]]*\]`)
	grouping  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	offsets   = regexp.MustCompile(`\boffset\s+-?[0-9][0-9a-z]*`)
	ident     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
	keywords  = []string{"and", "or", "unless", "bool", "group_left", "group_right"}
)

// metricNames returns the metric names a PromQL expression selects: what is left once
// strings, label matchers, ranges and grouping clauses are removed, minus functions and
// keywords.
func metricNames(expr string) []string {
	s := quoted.ReplaceAllString(expr, `""`)
	s = matchers.ReplaceAllString(s, " ")
	s = durations.ReplaceAllString(s, " ")
	s = grouping.ReplaceAllString(s, " ")
	s = offsets.ReplaceAllString(s, " ")
	var names []string
	for _, m := range ident.FindAllString(s, -1) {
		m = strings.TrimSpace(m)
		if strings.HasSuffix(m, "(") || slices.Contains(keywords, m) {
			continue
		}
		names = append(names, m)
	}
	return names
}

// family is the metric family that a series name belongs to, in the families given: a
// histogram's _bucket, _sum and _count series belong to the histogram.
func family(mfs map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if mf, ok := mfs[name]; ok {
		return mf
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if mf, ok := mfs[strings.TrimSuffix(name, suffix)]; ok && strings.HasSuffix(name, suffix) && mf.GetType() == dto.MetricType_HISTOGRAM {
			return mf
		}
	}
	return nil
}

// guardWebhookName is what the dashboard's (and the alerts') name matcher selects.
var guardWebhookName = regexp.MustCompile(`^.+\.exit-guard\.io$`)

// TestDashboardQueriesNameRealMetrics checks the Grafana dashboard: the chart's ConfigMap
// carries the file as it is; every query parses (promtool, as recording rules); and every
// metric a query names (or an alert of the PrometheusRule) is one the guard or the API server
// really exports, read from their
// /metrics after the guard has allowed, refused, and (stopped) been failed open on. The API
// server's series must carry the guard's webhook names.
func TestDashboardQueriesNameRealMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	cm := only(t, render(t, profile{name: "dashboard", set: []string{"dashboard.enabled=true"}}, "eg", "argo"), "ConfigMap")
	if cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("the dashboard ConfigMap's labels %v lack Grafana's sidecar label", cm.GetLabels())
	}
	if data, _ := cm.Object["data"].(map[string]any)["exit-guard.json"].(string); data != strings.TrimSuffix(string(raw), "\n") {
		t.Errorf("the ConfigMap does not carry the dashboard file as it is")
	}
	exprs := dashboardQueries(t, raw)

	// Every query parses: promtool reads them as recording rules (Grafana's variables given
	// values).
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$cluster", ".*", "$namespace", ".*")
	var rules []map[string]string
	for i, e := range exprs {
		rules = append(rules, map[string]string{"record": "dashboard:query_" + strconv.Itoa(i), "expr": vars.Replace(e)})
	}
	file, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yaml"), file, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool(t), "check", "rules", "dashboard.yaml") //nolint:gosec // G204: the pinned promtool of this repository
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("a dashboard query does not parse: %v\n%s\n%s", err, out, file)
	}

	// A guard that has allowed and refused, then is stopped and failed open on.
	ns := newNamespace(t, nil)
	// The lock scan fast, so that its metric shows within the test.
	objs := render(t, chartCerts, "dash", ns, "--set", "guard.lockCheckInterval=1s", "--set", "guard.lockStuckAfter=1s")
	webhooks := install(t, objs)
	g, _ := startChartGuard(t, ns, objs)
	// Before any admission, the series the alerts count with increase() are there at 0:
	// one that first appeared at 1 would hide its first event, often the only one.
	fresh, err := g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		name   string
		labels map[string]string
	}{
		{"exit_guard_decisions_total", map[string]string{"verdict": "denied", "reason": "workflow-completed", "kind": "Pod", "source": "live-read"}},
		{"exit_guard_decisions_total", map[string]string{"verdict": "denied", "reason": "workflow-completed", "kind": "Pod", "source": "store"}},
		{"exit_guard_decisions_total", map[string]string{"verdict": "denied", "reason": "workflow-deleted", "kind": "WorkflowTaskSet", "source": "store"}},
		{"exit_guard_decisions_total", map[string]string{"verdict": "allowed", "reason": "unverified-fail-open", "kind": "Pod", "source": "store"}},
		{"exit_guard_live_read_failures_total", map[string]string{"kind": "timeout"}},
	} {
		if v, ok := sample(fresh, want.name, want.labels); !ok || v != 0 {
			t.Errorf("%s%v at start: %v (present %v), want 0", want.name, want.labels, v, ok)
		}
	}
	registerAt(t, webhooks[0], fmt.Sprintf("https://%s:%d", env.WebhookHost, env.WebhookPort), env.WebhookCAData)
	// A pod as Argo makes it, with its executor (the release panel's exit_guard_argo_exposure).
	running := fixture.ExitPod(createWorkflow(t, ns, argo.PhaseRunning))
	running.Spec.Containers = append(running.Spec.Containers, corev1.Container{Name: "wait", Image: "quay.io/argoproj/argoexec:v3.5.14"})
	if err := env.Client.Create(t.Context(), running); err != nil {
		t.Fatal(err)
	}
	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	if err := env.Client.Create(t.Context(), fixture.ExitPod(done)); err == nil {
		t.Fatal("the stale pod was admitted")
	}
	// The stale copy's failure Event, refused: its pass is counted by workflow.
	if err := env.Client.Create(t.Context(), fixture.WorkflowEvent(done, "WorkflowFailed", "child failed")); err == nil {
		t.Fatal("the stale copy's WorkflowFailed Event was admitted")
	}
	// A workflow waiting on a mutex that the completed workflow holds in Argo's memory.
	waiter := createWorkflow(t, ns, argo.PhasePending)
	lock := ns + "/Mutex/probe"
	waiter.Object["status"].(map[string]any)["message"] = "Waiting for " + lock + " lock. Lock status: 0/1"
	waiter.Object["status"].(map[string]any)["synchronization"] = map[string]any{"mutex": map[string]any{
		"waiting": []any{map[string]any{"mutex": lock, "holder": ns + "/" + done.GetName()}}}}
	if err := env.Client.Update(t.Context(), waiter); err != nil {
		t.Fatal(err)
	}
	var guard map[string]*dto.MetricFamily
	err = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		guard, err = g.Metrics(ctx)
		return err == nil && family(guard, "exit_guard_sync_stuck_workflows") != nil, nil
	})
	if err != nil {
		t.Fatalf("the guard never reported the stuck waiter (exit_guard_sync_stuck_workflows): %v", err)
	}
	if err := g.Stop(); err != nil {
		t.Logf("stopping the guard: %v", err)
	}
	if err := env.Client.Create(t.Context(), fixture.ExitPod(done)); err != nil {
		t.Fatalf("with the guard stopped the API server should fail open: %v", err)
	}
	apiserver, err := env.APIServerMetrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	// The alerts' queries too.
	rule := only(t, render(t, profile{name: "alerts", set: []string{"prometheusRule.enabled=true"}}, "eg", "argo"), "PrometheusRule")
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	for _, g := range groups {
		rs, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rs {
			exprs = append(exprs, r.(map[string]any)["expr"].(string))
		}
	}
	recorded := map[string]bool{}
	for _, g := range groups {
		rs, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rs {
			if name, ok := r.(map[string]any)["record"].(string); ok {
				recorded[name] = true
			}
		}
	}
	for _, e := range exprs {
		names := metricNames(e)
		if len(names) == 0 {
			t.Errorf("no metric found in %q", e)
		}
		for _, n := range names {
			// up is Prometheus's own series of each target's scrape (ExitGuardNoReadyReplica,
			// ExitGuardNotScraped), selected by the guard's container name.
			if family(guard, n) != nil || recorded[n] || n == "up" && strings.Contains(e, `container="exit-guard"`) {
				continue
			}
			mf := family(apiserver, n)
			if mf == nil {
				t.Errorf("%s (in %q) is exported by neither the guard nor the API server", n, e)
				continue
			}
			// apiserver_request_total is read whole: it says whether the API server is scraped.
			if n != "apiserver_request_total" && !hasGuardWebhookSeries(mf) {
				t.Errorf("the API server exports %s, but no series of it names the guard's webhooks", n)
			}
		}
	}
}

// sample returns the value of the counter series of name with exactly labels.
func sample(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
series:
	for _, m := range mf.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] != l.GetValue() {
				continue series
			}
		}
		return m.GetCounter().GetValue(), true
	}
	return 0, false
}

func hasGuardWebhookSeries(mf *dto.MetricFamily) bool {
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "name" && guardWebhookName.MatchString(l.GetValue()) {
				return true
			}
		}
	}
	return false
}

// TestMetricNamesFindsEverySelector guards the test's own parser on the shapes the dashboard
// and the alerts use.
func TestMetricNamesFindsEverySelector(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (verdict) (rate(exit_guard_decisions_total{namespace=~"$namespace"}[5m]))`:                                   {"exit_guard_decisions_total"},
		`histogram_quantile(0.99, sum by (le, name) (rate(a_seconds_bucket{name=~"(x|y)\\.io"}[5m])))`:                       {"a_seconds_bucket"},
		`time() - max by (pod) (exit_guard_watch_last_progress_timestamp_seconds)`:                                           {"exit_guard_watch_last_progress_timestamp_seconds"},
		`(max(exit_guard_ready{namespace="argo"}) or vector(0)) < 1`:                                                         {"exit_guard_ready"},
		`sum(rate(a_total[5m])) / ignoring(kind) group_left sum(rate(b_total{x="y"}[5m])) unless on (pod) c offset 5m and d`: {"a_total", "b_total", "c", "d"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %v, want %v", expr, got, want)
		}
	}
}

// The name matchers of the dashboard's and the alerts' API-server series select every webhook
// the chart installs, in every mode, and the test's own matcher is the same.
func TestWebhookNameMatchersCoverEveryWebhook(t *testing.T) {
	var names []string
	for _, mode := range []string{"enforce", "warn"} {
		for _, o := range render(t, profile{name: mode, set: []string{"guard.mode=" + mode}}, "eg", "argo") {
			if k := o.GetKind(); k != "ValidatingWebhookConfiguration" && k != "MutatingWebhookConfiguration" {
				continue
			}
			hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
			for _, h := range hooks {
				names = append(names, h.(map[string]any)["name"].(string))
			}
		}
	}
	if !slices.Contains(names, "validate-event.exit-guard.io") || !slices.Contains(names, "mutate.exit-guard.io") {
		t.Fatalf("the chart renders the webhooks %v: the Event or the mutating webhook is missing", names)
	}
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	sources := dashboardQueries(t, raw)
	rule := only(t, render(t, profile{name: "alerts", set: []string{"prometheusRule.enabled=true"}}, "eg", "argo"), "PrometheusRule")
	var spec struct {
		Groups []struct {
			Rules []struct {
				Expr string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	raw, err = yaml.Marshal(rule.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			sources = append(sources, r.Expr)
		}
	}
	// A PromQL string: its \\ is one backslash of the regular expression.
	matcher := regexp.MustCompile(`name=~"([^"]*)"`)
	found := 0
	for _, src := range sources {
		for _, m := range matcher.FindAllStringSubmatch(src, -1) {
			found++
			re, err := regexp.Compile(`^(?:` + strings.ReplaceAll(m[1], `\\`, `\`) + `)$`)
			if err != nil {
				t.Fatalf("matcher %q: %v", m[1], err)
			}
			for _, n := range names {
				if !re.MatchString(n) {
					t.Errorf("the matcher name=~%q misses the webhook %s", m[1], n)
				}
			}
		}
	}
	if found == 0 {
		t.Fatal("no name matcher found in the dashboard or the alerts")
	}
	for _, n := range names {
		if !guardWebhookName.MatchString(n) {
			t.Errorf("the test's guardWebhookName misses the webhook %s", n)
		}
	}
}

// TestDashboardDecodesStrictly reads the dashboard as Grafana's own schema types do, strictly
// (the foundation SDK, its default panel and query plugins registered): an unknown field, a
// field of the wrong type or a panel Grafana does not know fails.
func TestDashboardDecodesStrictly(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	plugins.RegisterDefaultPlugins()
	// The classic dashboard model, which file-provisioned (sidecar) dashboards use; the SDK's
	// dashboardv2 is the model of Grafana's v2 API.
	var d dashboard.Dashboard //nolint:staticcheck // SA1019: see above
	// The SDK returns its list of errors as the error, empty (not nil) when none.
	if err := d.UnmarshalJSONStrict(raw); err != nil {
		var errs cog.BuildErrors
		if !errors.As(err, &errs) || len(errs) != 0 {
			t.Fatalf("the dashboard does not decode strictly: %v", err)
		}
	}
	if d.Title == nil || *d.Title != "exit-guard" || len(d.Panels) == 0 {
		t.Errorf("decoded title %v with %d panels", d.Title, len(d.Panels))
	}
	// The decoder has teeth: a field Grafana does not know, in a panel, fails.
	bad := strings.Replace(string(raw), `"type": "stat",`, `"type": "stat", "justify": "auto",`, 1)
	if bad == string(raw) {
		t.Fatal("no stat panel to spoil")
	}
	var spoiled dashboard.Dashboard //nolint:staticcheck // SA1019: the classic model, as above
	var errs cog.BuildErrors
	if err := spoiled.UnmarshalJSONStrict([]byte(bad)); err == nil || (errors.As(err, &errs) && len(errs) == 0) {
		t.Error("a stat panel with an unknown field decoded strictly")
	}
}
