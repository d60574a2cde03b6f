//go:build e2e

package ops

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/figure"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// dashboard is the part of the chart's Grafana dashboard the test reads.
type dashboard struct {
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
			AllValue   string `json:"allValue"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashboardPanel `json:"panels"`
}

type dashboardPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

var legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// TestDashboardOnRealData runs the guard through what its dashboard shows (exit handlers
// allowed and refused, live reads hung, the guard stopped while the API server fails open, then
// fails closed), all scraped by the real Prometheus, and then runs every panel's query as
// Grafana would: its namespace variable from its own label_values query, both as All and as
// the guard's namespace, $__rate_interval and $__range worked out the way Grafana does for a
// scrape interval of 1 s. Every query must return a series with numbers in it, and every label
// a legend names must be on the series.
func TestDashboardOnRealData(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "charts", "exit-guard", "files", "dashboards", "exit-guard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	st := startStack(t)
	p := testenv.StartAPIProxy(t, env.Config)
	st.guardVia(t, p.KubeConfig(t), fastReads...)
	ns := newNamespace(t)
	start := time.Now()
	waitQuery(t, st, `exit_guard_ready{namespace="argo"} == 1`)

	// Allowed, refused, decided with the reads hung.
	for i := range 5 {
		running := testenv.CreateWorkflow(t, env.Client, ns, "running-"+strconv.Itoa(i), argo.PhaseRunning)
		if err := env.Client.Create(t.Context(), fixture.ExitPod(running)); err != nil {
			t.Fatal(err)
		}
	}
	done := testenv.CreateWorkflow(t, env.Client, ns, "done", argo.PhaseSucceeded)
	if err := env.Client.Create(t.Context(), fixture.ExitPod(done)); !contract.IsRefusal(err) {
		t.Fatalf("the stale exit handler: %v, want refused", err)
	}
	p.HangReads.Store(true)
	for i := range 3 {
		running := testenv.CreateWorkflow(t, env.Client, ns, "hung-"+strconv.Itoa(i), argo.PhaseRunning)
		_ = env.Client.Create(t.Context(), fixture.ExitPod(running))
	}
	p.HangReads.Store(false)
	// The guard away: the API server fails open, then (failurePolicy Fail) rejects. Each twice,
	// the second time once the API server's count has been scraped a few times: a count that
	// first appears already at 3 never rises, and a rate of it stays 0.
	st.stopGuard(t)
	uncalled := func(prefix, series string) {
		for round := range 2 {
			for i := range 3 {
				running := testenv.CreateWorkflow(t, env.Client, ns, fmt.Sprintf("%s-%d-%d", prefix, round, i), argo.PhaseRunning)
				_ = env.Client.Create(t.Context(), fixture.ExitPod(running))
			}
			waitQuery(t, st, `count_over_time(`+series+`[20s]) >= 3`)
		}
	}
	uncalled("open", `apiserver_admission_webhook_fail_open_count{name="validate.exit-guard.io"}`)
	setFailurePolicy(t, admissionregistrationv1.Fail)
	uncalled("closed", `apiserver_admission_webhook_rejection_count{name="validate.exit-guard.io",error_type="calling_webhook_error"}`)
	setFailurePolicy(t, admissionregistrationv1.Ignore)
	st.guardVia(t, p.KubeConfig(t), fastReads...)
	waitQuery(t, st, `exit_guard_ready{namespace="argo"} == 1`)
	// The API server's counts of both, scraped for 6 s since they appeared: a rate over the
	// last $__rate_interval (4 s) has two samples at least, the range's end cut to the second.
	// (Not increase(): a series that first appears at 3, when no earlier test of the process has
	// made it, increases by nothing.)
	waitQuery(t, st, `count_over_time(apiserver_admission_webhook_fail_open_count{name="validate.exit-guard.io"}[20s]) >= 6`)
	waitQuery(t, st, `count_over_time(apiserver_admission_webhook_rejection_count{name="validate.exit-guard.io",error_type="calling_webhook_error"}[20s]) >= 6`)
	end := time.Now()

	// The namespace variable, from its own query (label_values(metric, label)), as Grafana's
	// Prometheus data source asks for it.
	var nsVar struct{ definition, all string }
	for _, v := range d.Templating.List {
		if v.Name == "namespace" {
			nsVar.definition, nsVar.all = v.Definition, v.AllValue
		}
	}
	m := regexp.MustCompile(`^label_values\(([a-z_:]+),\s*([a-z_]+)\)$`).FindStringSubmatch(nsVar.definition)
	if m == nil {
		t.Fatalf("the namespace variable's query %q is not label_values(metric, label)", nsVar.definition)
	}
	values, err := testenv.LabelValues(t.Context(), st.prom.Addr, m[2], m[1], start, end)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(values, namespace) {
		t.Fatalf("the namespace variable offers %v, not the guard's namespace %s", values, namespace)
	}

	// Grafana's time variables for this range at the default 1,000 points: $__interval is the
	// range over the points (at least the scrape interval), $__rate_interval the larger of
	// $__interval plus the scrape interval and four scrape intervals.
	scrape := time.Second
	interval := max(end.Sub(start)/1000, scrape)
	rateInterval := max(interval+scrape, 4*scrape)
	rangeSecs := int(math.Ceil(end.Sub(start).Seconds()))
	checked := 0
	var preview []figure.Panel
	var walk func(ps []dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, pn := range ps {
			for _, tg := range pn.Targets {
				for _, nsValue := range []string{nsVar.all, regexp.QuoteMeta(namespace)} {
					q := strings.NewReplacer("$__rate_interval", fmt.Sprintf("%dms", rateInterval.Milliseconds()),
						"$__range", fmt.Sprintf("%ds", rangeSecs), "$cluster", ".*", "$namespace", nsValue).Replace(tg.Expr)
					got, err := testenv.QueryRange(t.Context(), st.prom.Addr, q, start, end, interval)
					if err != nil {
						t.Errorf("panel %q: %v", pn.Title, err)
						continue
					}
					numbers, nonZero := 0, false
					for _, s := range got {
						numbers += len(s.V)
						for _, v := range s.V {
							nonZero = nonZero || v != 0
						}
					}
					// Every time series shows what the run did (a stat may be 0: no restart,
					// none admitted unverified).
					if pn.Type == "timeseries" && numbers > 0 && !nonZero {
						t.Errorf("panel %q, namespace %q: %s is 0 throughout", pn.Title, nsValue, q)
					}
					if numbers == 0 {
						scrapes, _ := testenv.QueryRange(t.Context(), st.prom.Addr, `scrape_duration_seconds`, start, end, interval)
						t.Errorf("panel %q, namespace %q: %s returned %d series and no number (scrapes over the range: %v)", pn.Title, nsValue, q, len(got), scrapes)
						continue
					}
					for _, l := range legendLabel.FindAllStringSubmatch(tg.LegendFormat, -1) {
						found := false
						for _, s := range got {
							_, ok := s.Labels[l[1]]
							found = found || ok
						}
						if !found {
							t.Errorf("panel %q: the legend %q names %s, on none of the %d series of %s", pn.Title, tg.LegendFormat, l[1], len(got), q)
						}
					}
					checked++
					if pn.Type == "timeseries" && nsValue == nsVar.all {
						preview = appendPreview(preview, pn.Title, tg.LegendFormat, got, start)
					}
				}
			}
			walk(pn.Panels)
		}
	}
	walk(d.Panels)
	t.Logf("%d panel queries (each target with the namespace variable All and %s) returned data over %s", checked, namespace, end.Sub(start).Round(time.Second))
	if checked == 0 {
		t.Fatal("no panel query was checked")
	}
	// A preview of the time-series panels from these series (gonum's plot, not Grafana), when
	// asked for (make e2e-ops OPS_PREVIEW=path).
	if err := figure.Write(os.Getenv("EXIT_GUARD_DASHBOARD_PREVIEW"), "seconds into the run", nil, false, preview...); err != nil {
		t.Error(err)
	}
}

// appendPreview adds the series of one target to the preview panel titled title (a new one
// for a new title), each named by its legend with the series' labels put in.
func appendPreview(panels []figure.Panel, title, legend string, got []testenv.Series, start time.Time) []figure.Panel {
	title += " (preview)"
	if len(panels) == 0 || panels[len(panels)-1].Title != title {
		panels = append(panels, figure.Panel{Title: title})
	}
	pn := &panels[len(panels)-1]
	for _, s := range got {
		if !slices.ContainsFunc(s.V, func(v float64) bool { return v != 0 }) {
			continue // 0 throughout: left out of the preview's legend
		}
		name := legendLabel.ReplaceAllStringFunc(legend, func(m string) string {
			return s.Labels[legendLabel.FindStringSubmatch(m)[1]]
		})
		x := make([]float64, len(s.At))
		for i, at := range s.At {
			x[i] = at - float64(start.Unix())
		}
		pn.Lines = append(pn.Lines, figure.Line{Name: name, X: x, Y: s.V})
	}
	return panels
}
