//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// The user metrics of the reference workflows, as the controller exports them: a
// workflow-level and a template-level counter of runs that did not succeed.
const (
	workflowMetric = "argo_workflows_workflow_not_succeeded"
	templateMetric = "argo_workflows_step_not_succeeded"
)

// totals are the run's workflow counters, read before its first workflow and at its end.
type totals struct{ before, after counts }

type counts struct {
	// failedOrError is the controller's argo_workflows_total_count{phase=~"Failed|Error"}
	// (3.6 and later; absent: no such series yet).
	failedOrError *float64
	// eventRefusals is the guard's exit_guard_decisions_total of refused failure Events
	// (nil without the guard).
	eventRefusals *float64
}

// readTotals reads the counters of the controller (waiting for its metrics endpoint) and of
// the guard g (nil: none).
func readTotals(ctx context.Context, t *testing.T, g *testenv.Guard) counts {
	t.Helper()
	var c counts
	var mfs map[string]*dto.MetricFamily
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		mfs, err = scrapeController(ctx)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the controller's metrics endpoint did not answer: %v", err)
	}
	if mf := mfs["argo_workflows_total_count"]; mf != nil {
		var n float64
		found := false
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" && (l.GetValue() == "Failed" || l.GetValue() == "Error") {
					n += m.GetCounter().GetValue()
					found = true
				}
			}
		}
		if found {
			c.failedOrError = &n
		}
	}
	if g != nil {
		gm, err := g.Metrics(ctx)
		if err != nil {
			t.Fatalf("reading the guard's metrics: %v", err)
		}
		n := testenv.SumSeries(gm, "exit_guard_decisions_total", map[string]string{"kind": "Event", "verdict": "denied", "reason": string(contract.ReasonWorkflowSucceeded)})
		c.eventRefusals = &n
	}
	return c
}

// failedOrErrorAdded is how much argo_workflows_total_count{phase=~"Failed|Error"} moved during
// the run (0 where the controller has no such series).
func (tot *totals) failedOrErrorAdded() float64 {
	var before, after float64
	if tot.before.failedOrError != nil {
		before = *tot.before.failedOrError
	}
	if tot.after.failedOrError != nil {
		after = *tot.after.failedOrError
	}
	return after - before
}

func (c counts) String() string {
	f := func(p *float64) string {
		if p == nil {
			return "absent"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("argo_workflows_total_count{phase=~\"Failed|Error\"} %s, refused failure Events %s", f(c.failedOrError), f(c.eventRefusals))
}

// The signals no webhook can stop, measured: a workflow-level user metric (spec.metrics, a
// counter when "{{status}} != Succeeded"), a template-level one, and the controller's own
// workflow counters, on v3.4.17 and v3.6.18 with the guard off and on. The stale copy's pass
// runs in the controller's process; whether it emits them is what this test reports. With the
// guard, the run's series are written as a promtool test of the chart's correction rules and
// the recipe of examples/corrected-user-metric-rules.yaml, which must then fire for the
// failing workflow alone (E2E_CAPTURE_DIR keeps the file).
func TestSignalsNoWebhookCanStop(t *testing.T) {
	n := tries(t)
	for _, version := range []string{"v3.4.17", "v3.6.18"} {
		for _, mode := range []guardMode{noGuard, guardDirect} {
			what := version + ", user metrics, " + map[guardMode]string{noGuard: "without the guard", guardDirect: "with the guard"}[mode]
			t.Run(what, func(t *testing.T) {
				tot := &totals{}
				outs := runScenario(t, scenario{version: version, mode: mode, ok: n, failing: 1, metrics: true, totals: tot})
				report(t, what, outs)
				var wfMetric, tmplMetric, failingWF int
				for _, o := range outs {
					t.Logf("  %s (should fail: %v): workflow metric %v, template metric %v, the guard's stale passes %v", o.name, o.wantFail, o.workflowMetric, o.templateMetric, o.staleFailures)
					switch {
					case o.wantFail && o.workflowMetric > 0:
						failingWF++
					case !o.wantFail && o.workflowMetric > 0:
						wfMetric++
					}
					if !o.wantFail && o.templateMetric > 0 {
						tmplMetric++
					}
				}
				t.Logf("RESULT %s: of %d succeeding workflows, the workflow-level 'not succeeded' counter moved for %d, the template-level one for %d; the failing workflow's counter moved: %v",
					what, n, wfMetric, tmplMetric, failingWF == 1)
				t.Logf("RESULT %s: before the first workflow: %v; at the end: %v", what, tot.before, tot.after)
				if failingWF != 1 {
					t.Errorf("the failing workflow's own counter did not move: the metrics were not read (is the controller's metrics endpoint at 127.0.0.1:9090?)")
				}
				if mode == guardDirect {
					checkCorrection(t, version, outs)
				}
			})
		}
	}
}

// checkCorrection writes the run's series as a promtool test of the chart's correction rules
// and the example recipe, and runs it: the corrected alert fires for the failing workflows
// alone; without the guard's series (the control) it fires for every workflow whose counter
// moved.
func checkCorrection(t *testing.T, version string, outs []outcome) {
	t.Helper()
	file := correctionTest(version, outs)
	for _, o := range outs {
		if !o.wantFail && o.workflowMetric > 0 && o.staleFailures == 0 {
			t.Errorf("%s: its counter moved, but the guard counted no stale pass of it: the correction misses it", o.name)
		}
	}
	dir := t.TempDir()
	if keep := os.Getenv("E2E_CAPTURE_DIR"); keep != "" {
		dir = keep
	}
	name := "signals-" + version + "_test.yaml"
	if err := os.WriteFile(filepath.Join(dir, name), file, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := testenv.PromtoolTest(dir, name); err != nil {
		t.Errorf("%v\n%s", err, file)
	}
}

// The captured series are written at 1-minute steps: their values before the first workflow
// for the first beforeSteps samples, then their values at the end.
const (
	beforeSteps, afterSteps = 10, 60
	correctionEval          = "65m"
)

// series is a promtool input series: absent (nil) or before, then after. (A count that makes
// a series appear is invisible to increase(): the series of workflow counts by phase, which
// appear at their first count, cannot be tested this way; docs/alerts.md says what that means.)
func series(labels string, before, after *float64) map[string]string {
	var vs []string
	for i := range beforeSteps + afterSteps {
		v := before
		if i >= beforeSteps {
			v = after
		}
		if v == nil {
			vs = append(vs, "_")
		} else {
			vs = append(vs, fmt.Sprint(*v))
		}
	}
	return map[string]string{"series": labels, "values": strings.Join(vs, " ")}
}

// correctionTest is the promtool test of the run's series (see checkCorrection).
func correctionTest(version string, outs []outcome) []byte {
	const (
		guardTarget = `job="exit-guard",namespace="argo",pod="exit-guard-0"`
		ctrlTarget  = `job="workflow-controller-metrics",namespace="argo",pod="workflow-controller-0"`
	)
	var withGuard, control []map[string]string
	var fired, firedControl []map[string]any
	alert := func(wf string) map[string]any {
		return map[string]any{"exp_labels": map[string]string{"severity": "warning", "workflow": wf},
			"exp_annotations": map[string]string{"summary": "Workflow " + wf + " did not succeed."}}
	}
	for _, o := range outs {
		if o.workflowMetric > 0 {
			v := o.workflowMetric
			s := series(fmt.Sprintf(`%s{%s,workflow=%q}`, workflowMetric, ctrlTarget, o.name), nil, &v)
			withGuard, control = append(withGuard, s), append(control, s)
			firedControl = append(firedControl, alert(o.name))
		}
		if o.staleFailures > 0 {
			v := o.staleFailures
			withGuard = append(withGuard, series(fmt.Sprintf(`exit_guard_stale_failures_total{%s,workflow_namespace=%q,workflow=%q}`, guardTarget, namespace, o.name), nil, &v))
		}
		if o.wantFail {
			fired = append(fired, alert(o.name))
		}
	}
	tests := []any{}
	group := func(name string, input []map[string]string, alerts []map[string]any) map[string]any {
		slices.SortFunc(input, func(a, b map[string]string) int { return strings.Compare(a["series"], b["series"]) })
		g := map[string]any{"name": name, "interval": "1m", "input_series": input,
			"alert_rule_test": []any{map[string]any{"eval_time": correctionEval, "alertname": "ArgoWorkflowDidNotSucceed", "exp_alerts": alerts}}}
		return g
	}
	tests = append(tests, group("the run's series: the alert fires for the failing workflows alone", withGuard, fired),
		group("control, without the guard's series: the alert fires for every workflow whose counter moved", control, firedControl))
	out, err := yaml.Marshal(map[string]any{"rule_files": []string{"rules.yaml", "recipe.yaml"}, "evaluation_interval": "1m", "tests": tests})
	if err != nil {
		panic(err) // maps of strings always marshal
	}
	header := fmt.Sprintf("# Captured by `make e2e-argo E2E_RUN=^TestSignalsNoWebhookCanStop` on Argo %s (%s, %d workflows):\n"+
		"# the controller's and the guard's series at the run's end, and where they exist before its first\n"+
		"# workflow; as a ServiceMonitor would label them. Run by test/chart (TestCorrectionOnCapturedSeries).\n",
		version, time.Now().UTC().Format("2006-01-02"), len(outs))
	return append([]byte(header), out...)
}
