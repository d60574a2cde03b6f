//go:build envtest

package chart

import (
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

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/yaml"
)

// scrape is what the guard and the API server exported at one moment.
type scrape struct {
	guard, apiserver map[string]*dto.MetricFamily
	at               time.Time
}

// series is one sample of a scrape: its series name (a histogram's _bucket, _sum and _count
// apart) and labels.
type series struct {
	name   string
	labels map[string]string
	value  float64
	// counter: a counter's, or a histogram's, which only grows; a gauge's moves with time.
	counter bool
}

func (s series) key() string {
	names := make([]string, 0, len(s.labels))
	for n := range s.labels {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString(s.name + "{")
	for i, n := range names {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(n + "=" + strconv.Quote(s.labels[n]))
	}
	b.WriteString("}")
	return b.String()
}

// flatten lists the samples of the families, with extra labels added to each.
func flatten(mfs map[string]*dto.MetricFamily, extra map[string]string) map[string]series {
	out := map[string]series{}
	add := func(name string, m *dto.Metric, more map[string]string, v float64, counter bool) {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		for k, v := range extra {
			l[k] = v
		}
		for k, v := range more {
			l[k] = v
		}
		s := series{name: name, labels: l, value: v, counter: counter}
		out[s.key()] = s
	}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				add(name, m, nil, m.GetCounter().GetValue(), true)
			case dto.MetricType_GAUGE:
				add(name, m, nil, m.GetGauge().GetValue(), false)
			case dto.MetricType_UNTYPED:
				add(name, m, nil, m.GetUntyped().GetValue(), false)
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add(name+"_bucket", m, map[string]string{"le": strconv.FormatFloat(b.GetUpperBound(), 'f', -1, 64)}, float64(b.GetCumulativeCount()), true)
				}
				add(name+"_bucket", m, map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()), true)
				add(name+"_sum", m, nil, h.GetSampleSum(), true)
				add(name+"_count", m, nil, float64(h.GetSampleCount()), true)
			}
		}
	}
	return out
}

// samples is a scrape as Prometheus would store it: the guard's series with the namespace and
// pod labels of its scrape, the API server's as they are.
func (s scrape) samples(ns string) map[string]series {
	all := flatten(s.guard, map[string]string{"namespace": ns, "pod": "exit-guard-0"})
	for k, v := range flatten(s.apiserver, nil) {
		all[k] = v
	}
	return all
}

// selector is one series selector of a PromQL expression: a metric name and its matchers.
type selector struct {
	name     string
	matchers []matcher
}

type matcher struct {
	label, op string
	value     string
	re        *regexp.Regexp
}

var (
	selectorRe = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	matcherRe  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")`)
)

// selectors lists the selectors of expr: every metric name metricNames finds, with the
// matchers that follow it, if any.
func selectors(t *testing.T, expr string) []selector {
	t.Helper()
	withMatchers := map[string][]matcher{}
	for _, m := range selectorRe.FindAllStringSubmatch(expr, -1) {
		var ms []matcher
		for _, mm := range matcherRe.FindAllStringSubmatch(m[2], -1) {
			v, err := strconv.Unquote(mm[3])
			if err != nil {
				t.Fatalf("matcher %s in %q: %v", mm[0], expr, err)
			}
			x := matcher{label: mm[1], op: mm[2], value: v}
			if x.op == "=~" || x.op == "!~" {
				x.re = regexp.MustCompile("^(?:" + v + ")$")
			}
			ms = append(ms, x)
		}
		withMatchers[m[1]] = append(withMatchers[m[1]], ms...)
	}
	var out []selector
	for _, n := range metricNames(expr) {
		out = append(out, selector{name: n, matchers: withMatchers[n]})
	}
	return out
}

func (sel selector) selects(s series) bool {
	if s.name != sel.name {
		return false
	}
	for _, m := range sel.matchers {
		v := s.labels[m.label]
		var ok bool
		switch m.op {
		case "=":
			ok = v == m.value
		case "!=":
			ok = v != m.value
		case "=~":
			ok = m.re.MatchString(v)
		case "!~":
			ok = !m.re.MatchString(v)
		}
		if !ok {
			return false
		}
	}
	return true
}

// realWork says whether a series counts work the check really causes, as any request does:
// the guard's live read of the check's workflow (its latency, retries, failures) and the API
// server's call of the webhook (its latency). A decision is not among them.
func realWork(name string) bool {
	return strings.HasPrefix(name, "exit_guard_live_read_") || strings.HasPrefix(name, "apiserver_admission_webhook_admission_duration_seconds")
}

// checkPanelsUnmoved fails for every counter a panel of the dashboard selects that moved
// between the two scrapes, other than those of the check's real work (realWork).
func checkPanelsUnmoved(t *testing.T, ns string, before, after scrape) {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$namespace", ".*")
	b, a := before.samples(ns), after.samples(ns)
	for _, expr := range dashboardQueries(t, raw) {
		expr = vars.Replace(expr)
		for _, sel := range selectors(t, expr) {
			for k, s := range a {
				if !s.counter || !sel.selects(s) || s.value == b[k].value {
					continue
				}
				if realWork(s.name) {
					continue
				}
				t.Errorf("the check moved %s from %v to %v, which the dashboard's panel %q shows", k, b[k].value, s.value, expr)
			}
		}
	}
}

// checkAlertsSilent evaluates the chart's alerts (release in ns) with promtool on the series
// the alerts read: for 30 minutes as they were before the check, then for 30 as they were after
// it. No alert may fire at any moment after the check.
func checkAlertsSilent(t *testing.T, release, ns string, before, after scrape) {
	t.Helper()
	rule := only(t, render(t, profile{name: "alerts", set: []string{"prometheusRule.enabled=true"}}, release, ns), "PrometheusRule")
	spec := rule.Object["spec"]
	names := alertNames(t, spec)
	var read []selector
	groups, _ := spec.(map[string]any)["groups"].([]any)
	for _, g := range groups {
		rules, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range rules {
			read = append(read, selectors(t, r.(map[string]any)["expr"].(string))...)
		}
	}
	b, a := before.samples(ns), after.samples(ns)
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	var inputs []map[string]string
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s := a[k]
		if !slices.ContainsFunc(read, func(sel selector) bool { return sel.name == s.name }) {
			continue
		}
		// A counter that first appears with the check was 0 before it: given as 0, not as
		// missing, so that increase() and rate() see its first count.
		first := "_x29"
		if s.counter {
			first = "0x29"
		}
		if old, ok := b[k]; ok {
			first = num(old.value) + "x29"
		}
		then := num(s.value) + "x29"
		if strings.HasSuffix(s.name, "_timestamp_seconds") && s.value > 0 {
			// A time, in Unix seconds: kept as old, at each of promtool's minutes, as it was at
			// its scrape (promtool's clock starts at 0).
			first, then = since(before.at, b[k].value, 0), since(after.at, s.value, 30)
		}
		inputs = append(inputs, map[string]string{"series": k, "values": first + " " + then})
	}
	if len(inputs) == 0 {
		t.Fatal("no series that an alert reads was scraped")
	}
	// The scrape itself, as Prometheus records it for the guard's target: up, 1 throughout.
	inputs = append(inputs, map[string]string{"series": fmt.Sprintf(`up{namespace=%q,container="exit-guard",pod="guard"}`, ns), "values": "1x59"})
	var cases []map[string]any
	for _, at := range []string{"31m", "40m", "59m"} {
		for _, n := range names {
			cases = append(cases, map[string]any{"eval_time": at, "alertname": n, "exp_alerts": []any{}})
		}
	}
	rules, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := yaml.Marshal(map[string]any{
		"rule_files":          []string{"rules.yaml"},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"name": "the check fires nothing", "interval": "1m", "input_series": inputs, "alert_rule_test": cases,
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for f, data := range map[string][]byte{"rules.yaml": rules, "quiet_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(promtool(t), "test", "rules", "quiet_test.yaml") //nolint:gosec // G204: the pinned promtool of this repository
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("an alert fired after the check (%d series read, before and after it): %v\n%s", len(inputs), err, out)
	}
	t.Logf("%d alerts silent on %d series, before and after the check", len(names), len(inputs))
}

// since is the samples of a timestamp that was value at scraped, for promtool's minutes from
// minute on, 30 of them: each as old as the timestamp was when scraped.
func since(scraped time.Time, value float64, minute int) string {
	age := float64(scraped.Unix()) - value
	var vs []string
	for m := minute; m < minute+30; m++ {
		vs = append(vs, strconv.FormatFloat(float64(m*60)-age, 'f', -1, 64))
	}
	return strings.Join(vs, " ")
}

// moved is a short account of the counters that moved between two scrapes, for a failure.
func moved(before, after scrape, ns string) string {
	b, a := before.samples(ns), after.samples(ns)
	var out []string
	for k, s := range a {
		if s.counter && s.value != b[k].value && strings.HasPrefix(s.name, "exit_guard_") {
			out = append(out, fmt.Sprintf("%s %v→%v", k, b[k].value, s.value))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}
