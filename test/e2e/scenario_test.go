//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

type guardMode int

const (
	noGuard guardMode = iota
	guardDirect
	// guardLagging: the guard's own Workflow watch lags as much as the controller's.
	guardLagging
	// guardNoEventRule: the guard, with the chart's Event webhook off
	// (webhook.events.enabled=false): pods and TaskSet writes only.
	guardNoEventRule
)

// outcome is what became of one workflow.
type outcome struct {
	name       string
	wantFail   bool
	phase      argo.Phase
	notifyPods int // notification pods the API server admitted: exit handlers, and hooks with scenario.hook
	// hookPods are the failure hook's pods among them (scenario.hook), and lateHooks those
	// created after the workflow's terminal write: a stale pass's.
	hookPods, lateHooks int
	// realNotices are those of them created before the workflow's terminal write (within its
	// finishedAt, to the second, and the kubelet stand-in's 200 ms): the real pass's, not one a
	// stale copy of the completed workflow sent afterwards.
	realNotices int
	// Of an HTTP exit handler: the calls its URL received, and the agent pods admitted.
	calls, agentPods int
	// retried: the workflow was retried after it failed; callsBeforeRetry were made before.
	retried          bool
	callsBeforeRetry int
	denials          int // ExitHandlerDenied Events
	taskSetDenials   int // those of them for a WorkflowTaskSet write
	taskSetPatches   int // those of them for an update (a merge patch) of the TaskSet
	// refusals are the guard's refusals for the workflow as its log has them, one line each
	// (the Events' series count at most 2 before the recorder's periodic refresh), and
	// refusalSpan the time from the first to the last.
	refusals    int
	refusalSpan time.Duration
	// failedEvents are the WorkflowFailed Events about the workflow the API server kept
	// (occurrences: an Event's count), as Argo's controller records them.
	failedEvents int
	// With scenario.metrics: the workflow's own counters as the controller exports them, of
	// the workflow (spec.metrics) and of its work steps (template metrics), when not Succeeded.
	workflowMetric, templateMetric float64
	// staleFailures is the guard's count of the workflow's stale passes
	// (exit_guard_stale_failures_total).
	staleFailures float64
}

// scenario is one run of the proof.
type scenario struct {
	version     string
	mode        guardMode
	ok, failing int
	// http makes the exit handler an HTTP template, run by Argo's real agent (argoexec);
	// httpStep adds an HTTP step to the main steps.
	http, httpStep bool
	// retry retries each failing workflow once after it failed, as `argo retry` does.
	retry bool
	// env is added to the controller's environment.
	env []string
	// metrics gives the workflows a workflow-level and a template-level counter of runs that
	// did not succeed, and reads the controller's metrics at the end (outcome.metrics).
	metrics bool
	// totals, with metrics, gets the workflow counters of the controller and the guard, read
	// before the first workflow and at the end.
	totals *totals
	// hook gives every workflow a failure hook of that shape (withFailureHook), whose pods
	// count as notifications beside the exit handler's.
	hook string
	// mutex gives every workflow a workflow-level mutex of that name.
	mutex string
	// afterRun runs once the workflows completed and a stale copy had time to come back
	// (after the census is counted), with the run's rig and its workflows.
	afterRun func(ctx context.Context, r rig, wfs []*unstructured.Unstructured)
	// leader runs the controller with leader election on, as this identity (LEADER_ELECTION_IDENTITY),
	// with a lease of 4 s (upstream: 15 s) so that a standby takes over within seconds.
	leader string
	// direct: the controller watches the API server itself, with no lagging proxy between.
	direct bool
	// gc runs kube-controller-manager's garbage collector beside the API server.
	gc bool
	// drive, when set, creates workflows of its own (ok and failing stay 0) and returns
	// those the run waits for and reports.
	drive func(ctx context.Context, t *testing.T, r rig) []*unstructured.Unstructured
	// guardProxy puts a fault proxy (testenv.APIProxy) between the guard and the API server;
	// guardArgs are added to the guard's flags.
	guardProxy bool
	guardArgs  []string
	// census, when set, has the API server audit the controller's writes and counts those
	// about each workflow after it completed (census.count), once a stale copy had time to
	// come back.
	census *census
}

// rig is what a scenario's drive works with.
type rig struct {
	c      client.Client
	notify *notifier
	gc     *collector
	g      *testenv.Guard
	// proxy is the guard's fault proxy (scenario.guardProxy), k the kubelet stand-in, guardLog
	// the guard's output.
	proxy    *testenv.APIProxy
	k        *kubelet
	guardLog *testenv.Output
	// ctrlProxy is the lagging proxy between the controller and the API server (nil with
	// scenario.direct); restart stops the controller and starts it again; launch starts
	// another controller like the run's with extra flags and environment, logging beside it
	// (a standby, with leader election); launchSecond starts one as testenv.SecondControllerUser,
	// behind a lagging proxy of its own, logging into secondLog; stop stops the run's controller.
	ctrlProxy     *testenv.APIProxy
	restart, stop func()
	launch        func(args, env []string) *testenv.Process
	launchSecond  func(args, env []string) *testenv.Process
	secondLog     string
	// controllerLog is the file the controllers log into.
	controllerLog string
}

// run runs the reference workflows with a pod exit handler.
func run(t *testing.T, version string, mode guardMode, ok, failing int) []outcome {
	t.Helper()
	return runScenario(t, scenario{version: version, mode: mode, ok: ok, failing: failing})
}

// runScenario starts an API server with Argo's CRDs, the controller of version behind a
// lagging proxy, the kubelet stand-in (with Argo's agent for agent pods), and the guard as
// mode says; runs ok succeeding and failing workflows of the reference shape; and returns
// what became of each.
func runScenario(t *testing.T, sc scenario) []outcome {
	t.Helper()
	runs.Add(1)
	version, mode, ok, failing := sc.version, sc.mode, sc.ok, sc.failing
	ctrlBin, crds := controller(t, version)
	opts := testenv.Options{CRDDirs: []string{crds}, OwnCRDs: true}
	if mode != noGuard {
		// The chart's own webhooks, with its selectors and match conditions: what a user
		// installs, judged on Argo's own writes.
		var set []string
		if mode == guardNoEventRule {
			set = append(set, "webhook.events.enabled=false")
		}
		opts.ValidatingWebhooks = []*admissionregistrationv1.ValidatingWebhookConfiguration{chartWebhook(t, set...)}
	}
	if sc.census != nil {
		var err error
		if opts.APIServerFlags, sc.census.auditLog, err = testenv.AuditWrites(t.TempDir(), testenv.ControllerUser, testenv.SecondControllerUser); err != nil {
			t.Fatal(err)
		}
	}
	env, ctx, stop := startAPIServer(t, opts, nil)
	defer stop()
	c := env.Client

	var err error
	var g *testenv.Guard
	var guardProxy *testenv.APIProxy
	var guardOut *testenv.Output
	// With a mutex the guard runs without its webhooks too: its lock scan is what it brings.
	if mode != noGuard || sc.mutex != "" {
		kc := env.KubeConfig()
		if sc.guardProxy {
			guardProxy = testenv.StartAPIProxy(t, env.Config)
			kc = guardProxy.KubeConfig(t)
		}
		if mode == guardLagging {
			p := testenv.StartAPIProxyWith(t, env.Config, testenv.APIProxyOptions{WatchDelay: watchLag})
			defer func() { _ = p.Close() }()
			kc = p.KubeConfig(t)
		}
		guardOut = &testenv.Output{}
		args := []string{"--webhook-port=" + strconv.Itoa(env.WebhookPort), "--webhook-cert-path=" + env.WebhookCertDir, "--shutdown-delay=0s"}
		if sc.mutex != "" {
			args = append(args, "--lock-check-interval=5s", "--lock-stuck-after="+lockStuckAfter.String())
		}
		args = append(args, sc.guardArgs...)
		g, err = testenv.StartGuard(ctx, guardBin, kc, args, guardOut)
		if err != nil {
			t.Fatalf("%v\n%s", err, guardOut.String())
		}
		defer func() { _ = g.Stop() }()
		if dir := os.Getenv("E2E_LOG_DIR"); dir != "" {
			// The guard's log beside the controllers', once it has stopped.
			defer func() {
				_ = g.Stop()
				name := fmt.Sprintf("guard-%s-%d-%d.log", sc.version, mode, time.Now().Unix())
				if err := os.WriteFile(filepath.Join(dir, name), []byte(guardOut.String()), 0o600); err != nil {
					t.Errorf("keeping the guard's log: %v", err)
				}
			}()
		}
	}

	logDir := os.Getenv("E2E_LOG_DIR") // keep the controllers' and agents' logs there
	if logDir == "" {
		logDir = t.TempDir()
	} else if err := os.MkdirAll(logDir, 0o750); err != nil {
		t.Fatal(err)
	}
	k := newKubelet(c, namespace)
	var notify *notifier
	if sc.http {
		notify = newNotifier()
		defer notify.close()
		if k.agents, err = newAgents(filepath.Join(filepath.Dir(ctrlBin), "argoexec"), env.Config, namespace, logDir); err != nil {
			t.Fatal(err)
		}
		defer k.agents.stop()
	}
	go k.run(ctx)
	var gc *collector
	if sc.gc {
		gc = newCollector(t, env, logDir)
		gc.start(t)
		defer gc.stop()
	}

	// Argo's controller acts as a user of its own (with every permission), so that the API
	// server's audit log tells its writes apart.
	kc, ctrlCfg, err := env.KubeConfigAs(testenv.ControllerUser, "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	var ctrlProxy *testenv.APIProxy
	if !sc.direct {
		ctrlProxy = testenv.StartAPIProxyWith(t, ctrlCfg, testenv.APIProxyOptions{WatchDelay: watchLag})
		defer func() { _ = ctrlProxy.Close() }()
		kc = ctrlProxy.KubeConfig(t)
	}
	kcFile := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kcFile, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(logDir, fmt.Sprintf("controller-%s-%d-%d.log", version, mode, time.Now().Unix()))
	logOut, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logOut.Close() }()
	ctrlEnv := sc.env
	if sc.leader != "" {
		ctrlEnv = append(leaderElection(sc.leader), ctrlEnv...)
	}
	var ctrl *testenv.Process
	startController := func() {
		t.Helper()
		ctrl = launchController(t, ctrlBin, kcFile, "info", nil, ctrlEnv, logOut)
	}
	stopController := func() { _ = ctrl.Stop(controllerGrace) }
	startController()
	defer func() { stopController() }()
	var others []*testenv.Process
	defer func() {
		for _, p := range others {
			_ = p.Stop(controllerGrace)
		}
	}()
	secondLog := filepath.Join(logDir, fmt.Sprintf("controller-second-%s-%d-%d.log", version, mode, time.Now().Unix()))
	r := rig{c: c, notify: notify, gc: gc, g: g, proxy: guardProxy, k: k, guardLog: guardOut, ctrlProxy: ctrlProxy,
		restart: func() { stopController(); startController() }, stop: stopController, controllerLog: logFile,
		launch: func(args, env []string) *testenv.Process {
			p := launchController(t, ctrlBin, kcFile, "info", args, append(slices.Clone(ctrlEnv), env...), logOut)
			others = append(others, p)
			return p
		},
		secondLog: secondLog,
		launchSecond: func(args, extra []string) *testenv.Process {
			kc, cfg, err := env.KubeConfigAs(testenv.SecondControllerUser, "system:masters")
			if err != nil {
				t.Fatal(err)
			}
			if !sc.direct {
				// Its own watch lags as the first one's does.
				p := testenv.StartAPIProxyWith(t, cfg, testenv.APIProxyOptions{WatchDelay: watchLag})
				t.Cleanup(func() { _ = p.Close() })
				kc = p.KubeConfig(t)
			}
			f := filepath.Join(t.TempDir(), "kubeconfig-second")
			if err := os.WriteFile(f, kc, 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := os.Create(secondLog) //nolint:gosec // G304: the test's own log folder
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = out.Close() })
			p := launchController(t, ctrlBin, f, "info", args, append(slices.Clone(ctrlEnv), extra...), out)
			others = append(others, p)
			return p
		}}

	if sc.totals != nil {
		sc.totals.before = readTotals(ctx, t, g)
	}
	var wfs []*unstructured.Unstructured
	if sc.drive != nil {
		wfs = sc.drive(ctx, t, r)
	}
	for i := range ok + failing {
		wf := referenceWorkflow(i >= ok)
		if sc.metrics {
			withMetrics(wf)
		}
		if sc.mutex != "" {
			withMutex(wf, sc.mutex)
		}
		if sc.hook != noHook {
			withFailureHook(wf, sc.hook)
		}
		if sc.census != nil {
			withCensusFeatures(wf)
		}
		if sc.http {
			wf = httpWorkflow(i >= ok, notify.url(), sc.httpStep, notify.pingURL())
		}
		if err := c.Create(ctx, wf); err != nil {
			t.Fatal(err)
		}
		wfs = append(wfs, wf)
		// Stagger the starts, as a real queue would.
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	waitDone := func() {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
			for _, wf := range wfs {
				if !phase(ctx, c, wf).Terminal() {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil && sc.mutex != "" {
			// Held locks are what such a run measures: report, do not stop.
			for _, wf := range wfs {
				t.Logf("not complete within 4 minutes: %s %s", wf.GetName(), waitingOn(ctx, c, wf))
			}
			return
		}
		if err != nil {
			logs, _ := os.ReadFile(logFile)
			t.Fatalf("workflows did not complete on %s: %v\ncontroller log:\n%s", version, err, tail(logs, 60))
		}
	}
	waitDone()
	before := map[string]int{}
	if sc.retry {
		for i, wf := range wfs {
			if i >= ok {
				before[wf.GetName()] = notify.count(wf.GetName())
				retryWorkflow(ctx, t, c, wf)
			}
		}
		// The retried workflows run their failed parts, fail again, and notify again.
		err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			for i, wf := range wfs {
				if i >= ok && (!phase(ctx, c, wf).Terminal() || notify.count(wf.GetName()) == before[wf.GetName()]) {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Logf("the retried workflows did not all complete with a new call within two minutes")
		}
		waitDone()
	}
	// Give a stale copy time to come back, be reconciled, and try its exit handler.
	select {
	case <-ctx.Done():
	case <-time.After(settle):
	}

	if sc.census != nil {
		sc.census.count(ctx, t, c, wfs)
	}
	if sc.afterRun != nil {
		sc.afterRun(ctx, r, wfs)
	}
	var controllerMetrics, guardMetrics map[string]*dto.MetricFamily
	if sc.metrics {
		if controllerMetrics, err = scrapeController(ctx); err != nil {
			t.Errorf("reading the controller's metrics: %v", err)
		}
		if g != nil {
			if guardMetrics, err = g.Metrics(ctx); err != nil {
				t.Errorf("reading the guard's metrics: %v", err)
			}
		}
		if sc.totals != nil {
			sc.totals.after = readTotals(ctx, t, g)
		}
		for _, name := range []string{"argo_workflows_total_count", "argo_workflows_count"} {
			for _, m := range controllerMetrics[name].GetMetric() {
				var ls []string
				for _, l := range m.GetLabel() {
					ls = append(ls, l.GetName()+"="+l.GetValue())
				}
				t.Logf("controller metric %s{%s} = %v", name, strings.Join(ls, ","), m.GetCounter().GetValue()+m.GetGauge().GetValue())
			}
		}
	}
	var out []outcome
	for i, wf := range wfs {
		o := outcome{name: wf.GetName(), wantFail: i >= ok, phase: phase(ctx, c, wf), agentPods: k.agentPods(wf.GetName())}
		notices := []string{".onExit"}
		if sc.hook != noHook {
			notices = append(notices, ".hooks.")
			o.hookPods = len(k.pods(wf.GetName(), ".hooks."))
		}
		done := finishedAt(ctx, c, wf)
		for _, part := range notices {
			o.notifyPods += len(k.pods(wf.GetName(), part))
			for _, at := range k.podTimes(wf.GetName(), part) {
				switch {
				case !done.IsZero() && at.Before(done.Add(2*time.Second)):
					o.realNotices++
				case part == ".hooks.":
					o.lateHooks++
				}
			}
		}
		o.denials, o.taskSetDenials, o.taskSetPatches = denials(ctx, t, c, wf)
		if guardOut != nil {
			o.refusals, o.refusalSpan = refusalsLogged(guardOut, wf.GetUID())
		}
		o.failedEvents = failedEvents(ctx, t, c, wf)
		if sc.metrics {
			o.workflowMetric = testenv.SumSeries(controllerMetrics, workflowMetric, map[string]string{"workflow": wf.GetName()})
			o.templateMetric = testenv.SumSeries(controllerMetrics, templateMetric, map[string]string{"workflow": wf.GetName()})
			o.staleFailures = testenv.SumSeries(guardMetrics, "exit_guard_stale_failures_total", map[string]string{"workflow_namespace": namespace, "workflow": wf.GetName()})
		}
		if sc.http {
			o.calls = notify.count(wf.GetName())
			o.callsBeforeRetry, o.retried = before[wf.GetName()], sc.retry && i >= ok
		}
		out = append(out, o)
	}
	logs, _ := os.ReadFile(logFile)
	t.Logf("%s, guard %v: %d workflows; the controller's own stale-copy check fired %d times; its Event sink logged %d Events the API server rejected and dropped %d (queue full)",
		version, mode, len(wfs), strings.Count(string(logs), "Rejecting stale copy"), strings.Count(string(logs), "Server rejected event"),
		strings.Count(string(logs), "too many queued events"))
	if mode != noGuard {
		// What each webhook cost the writes it judged, as the API server measured it: for the
		// Event webhook, the delay every Event it judged added to the controller's sink.
		mfs, err := env.APIServerMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mfs["apiserver_admission_webhook_admission_duration_seconds"].GetMetric() {
			var name string
			var series []string
			for _, l := range m.GetLabel() {
				if l.GetName() == "name" {
					name = l.GetValue()
				} else {
					series = append(series, l.GetName()+"="+l.GetValue())
				}
			}
			h := m.GetHistogram()
			if h.GetSampleCount() == 0 || !strings.HasSuffix(name, "exit-guard.io") {
				continue
			}
			p99 := "+Inf"
			for _, b := range h.GetBucket() {
				if float64(b.GetCumulativeCount()) >= 0.99*float64(h.GetSampleCount()) {
					p99 = fmt.Sprintf("%gs", b.GetUpperBound())
					break
				}
			}
			t.Logf("webhook %s (%s): %d calls, mean %.1f ms, p99 at most %s (the API server's histogram)", name, strings.Join(series, " "), h.GetSampleCount(),
				1000*h.GetSampleSum()/float64(h.GetSampleCount()), p99)
		}
	}
	return out
}

func tail(b []byte, lines int) string {
	all := strings.Split(string(b), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
