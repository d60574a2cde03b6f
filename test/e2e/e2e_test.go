//go:build e2e

// Package e2e proves exit-guard on real Argo workflow-controllers: it reproduces the stale
// exit handler on an exposed controller, then shows the guard refusing it. Run it with
// `make e2e-argo` (E2E_TRIES workflows per run, default 5); docs/evidence/argo-e2e.md has the figures.
package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

const (
	namespace = "argo-e2e"
	// watchLag is how late the controller's Workflow watch events arrive. It must exceed the
	// gap between the last incomplete write and completion plus podGC's 5 s delay.
	watchLag = 9 * time.Second
	// settle is how long a run waits after its last workflow completed for a stale replay.
	settle = 30 * time.Second
)

var guardBin string

func TestMain(m *testing.M) {
	// The test's clients log the API server's warnings through controller-runtime.
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	dir, err := os.MkdirTemp("", "exit-guard-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if guardBin, err = testenv.BuildGuard(dir); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 && runs.Load() == 0 && flag.Lookup("test.list").Value.String() == "" {
		// A -run pattern (E2E_RUN) that matches nothing must not pass as a proof.
		fmt.Fprintln(os.Stderr, "FAIL: no run of the proof started: the -run pattern (E2E_RUN) matched no test")
		code = 1
	}
	os.Exit(code)
}

// runs counts the runs of the proof started (runScenario).
var runs atomic.Int32

func tries(t *testing.T) int {
	t.Helper()
	n := 5
	if s := os.Getenv("E2E_TRIES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("E2E_TRIES=%q: want a positive number", s)
		}
	}
	return n
}

// controller returns the cached workflow-controller of version and its CRD folder.
func controller(t *testing.T, version string) (bin, crds string) {
	t.Helper()
	out, err := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "argo-controllers.sh"), "path").Output()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), version)
	bin, crds = filepath.Join(dir, "workflow-controller"), filepath.Join(dir, "crds")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no workflow-controller %s at %s: run 'make e2e-argo' (it builds the controllers from Go modules)", version, bin)
	}
	return bin, crds
}

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
	notifyPods int // exit-handler notification pods the API server admitted
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
	// mutex gives every workflow a workflow-level mutex of that name.
	mutex string
	// afterRun runs once the workflows completed and a stale copy had time to come back;
	// restart restarts the controller.
	afterRun func(ctx context.Context, c client.Client, restart func(), g *testenv.Guard)
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
		helmBin, err := testenv.HelmBin()
		if err != nil {
			t.Fatal(err)
		}
		var set []string
		if mode == guardNoEventRule {
			set = append(set, "webhook.events.enabled=false")
		}
		vwc, err := testenv.ChartWebhook(helmBin, set...)
		if err != nil {
			t.Fatal(err)
		}
		opts.ValidatingWebhooks = []*admissionregistrationv1.ValidatingWebhookConfiguration{vwc}
	}
	env, err := testenv.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c := env.Client

	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "default"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "workflow-controller-configmap"}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

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
			p, err := startLagProxy(env.Config, watchLag)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = p.Close() }()
			kc = plainKubeconfig(t, p.URL())
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

	kc := env.KubeConfig()
	if !sc.direct {
		proxy, err := startLagProxy(env.Config, watchLag)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = proxy.Close() }()
		kc = plainKubeconfig(t, proxy.URL())
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
	var cmd *exec.Cmd
	startController := func() {
		t.Helper()
		cmd = exec.Command(ctrlBin, "--kubeconfig="+kcFile, "--namespaced", "--managed-namespace="+namespace,
			"--namespace="+namespace, "--executor-image=executor:e2e", "--loglevel=info")
		cmd.Env = append(append(os.Environ(), "LEADER_ELECTION_DISABLE=true", "DEFAULT_REQUEUE_TIME=1s"), sc.env...)
		cmd.Stdout, cmd.Stderr = logOut, logOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	stopController := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
		}
	}
	startController()
	defer func() { stopController() }()

	if sc.totals != nil {
		sc.totals.before = readTotals(ctx, t, g)
	}
	var wfs []*unstructured.Unstructured
	if sc.drive != nil {
		wfs = sc.drive(ctx, t, rig{c: c, notify: notify, gc: gc, g: g, proxy: guardProxy, k: k, guardLog: guardOut})
	}
	for i := range ok + failing {
		wf := referenceWorkflow(i >= ok)
		if sc.metrics {
			withMetrics(wf)
		}
		if sc.mutex != "" {
			withMutex(wf, sc.mutex)
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

	if sc.afterRun != nil {
		sc.afterRun(ctx, c, func() {
			stopController()
			startController()
		}, g)
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
		o := outcome{name: wf.GetName(), wantFail: i >= ok, phase: phase(ctx, c, wf),
			notifyPods: len(k.pods(wf.GetName(), ".onExit")), agentPods: k.agentPods(wf.GetName())}
		if done := finishedAt(ctx, c, wf); !done.IsZero() {
			for _, at := range k.podTimes(wf.GetName(), ".onExit") {
				if at.Before(done.Add(2 * time.Second)) {
					o.realNotices++
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

// finishedAt is the workflow's status.finishedAt (to the second), or the zero time.
func finishedAt(ctx context.Context, c client.Client, wf *unstructured.Unstructured) time.Time {
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(argo.WorkflowGVK)
	if err := c.Get(ctx, client.ObjectKeyFromObject(wf), cur); err != nil {
		return time.Time{}
	}
	s, _, _ := unstructured.NestedString(cur.Object, "status", "finishedAt")
	at, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}
	}
	return at
}

func phase(ctx context.Context, c client.Client, wf *unstructured.Unstructured) argo.Phase {
	got := &argo.Workflow{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(wf), got); err != nil {
		return ""
	}
	return got.Status.Phase
}

// denials counts the guard's refusals for wf (Event occurrences: the recorder folds a repeat
// into the first Event's series and writes counts past the second only on its periodic
// refresh, so a workflow shows at most 2 within minutes), those of WorkflowTaskSet writes among
// them, and of those the updates.
func denials(ctx context.Context, t *testing.T, c client.Client, wf *unstructured.Unstructured) (all, taskSets, taskSetUpdates int) {
	var list eventsv1.EventList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.Regarding.UID == wf.GetUID() && e.Reason == contract.EventReasonDenied {
			n := 1
			if e.Series != nil {
				n = int(e.Series.Count)
			}
			all += n
			if strings.HasSuffix(e.Action, "WorkflowTaskSet") {
				taskSets += n
			}
			if e.Action == "UpdateWorkflowTaskSet" {
				taskSetUpdates += n
			}
		}
	}
	return all, taskSets, taskSetUpdates
}

// refusalsLogged counts the refusals of the workflow of uid in the guard's log (a line each)
// and the time from the first to the last.
func refusalsLogged(out *testenv.Output, uid types.UID) (int, time.Duration) {
	var first, last time.Time
	lines := out.Lines(`"verdict":"denied"`, `"workflowUID":"`+string(uid)+`"`)
	for _, l := range lines {
		var entry struct {
			TS time.Time `json:"ts"`
		}
		if json.Unmarshal([]byte(l), &entry) != nil || entry.TS.IsZero() {
			continue
		}
		if first.IsZero() || entry.TS.Before(first) {
			first = entry.TS
		}
		if entry.TS.After(last) {
			last = entry.TS
		}
	}
	return len(lines), last.Sub(first)
}

// withMetrics gives wf a workflow-level counter and a template-level one (on its work steps)
// of runs that did not succeed, labelled by the workflow's name, as a user who alerts on them
// would write them.
func withMetrics(wf *unstructured.Unstructured) {
	counter := func(name string) map[string]any {
		return map[string]any{"prometheus": []any{map[string]any{
			"name": name, "help": "Runs that did not succeed.",
			"labels": []any{map[string]any{"key": "workflow", "value": "{{workflow.name}}"}},
			"when":   "{{status}} != Succeeded", "counter": map[string]any{"value": "1"},
		}}}
	}
	spec := wf.Object["spec"].(map[string]any)
	spec["metrics"] = counter(strings.TrimPrefix(workflowMetric, "argo_workflows_"))
	for _, tmpl := range spec["templates"].([]any) {
		if t := tmpl.(map[string]any); t["name"] == "work" {
			t["metrics"] = counter(strings.TrimPrefix(templateMetric, "argo_workflows_"))
		}
	}
}

// scrapeController reads the workflow-controller's metrics endpoint (its default, port 9090,
// path /metrics; TLS with a self-signed certificate, or plain HTTP, as its version serves it).
func scrapeController(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // G402: the test's own controller on loopback, self-signed
	var lastErr error
	for _, scheme := range []string{"https", "http"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://127.0.0.1:9090/metrics", nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode != http.StatusOK {
			lastErr = fmt.Errorf("GET /metrics: %s", resp.Status)
			continue
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		return parser.TextToMetricFamilies(resp.Body)
	}
	return nil, lastErr
}

// failedEvents counts the occurrences of WorkflowFailed Events about wf (core/v1, as Argo's
// controller records them; a repeat is a PATCH that raises count).
func failedEvents(ctx context.Context, t *testing.T, c client.Client, wf *unstructured.Unstructured) int {
	var list corev1.EventList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if e.InvolvedObject.UID == wf.GetUID() && e.Reason == argo.EventReasonWorkflowFailed {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

// plainKubeconfig reaches server over plain HTTP with no credentials (the proxy adds them).
func plainKubeconfig(t *testing.T, server string) []byte {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["proxy"] = &clientcmdapi.Cluster{Server: server}
	kc.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	kc.CurrentContext = "proxy"
	out, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// referenceWorkflow is the reference scenario of ARGO.md in the shape that lets a stale copy
// through: two parallel main pods, podGC OnPodCompletion, and an exit handler that notifies
// only when {{workflow.status}} != Succeeded. A failing one has its second pod fail.
func referenceWorkflow(fail bool) *unstructured.Unstructured {
	second := "b"
	if fail {
		second = "fail"
	}
	container := func(name, msg string) map[string]any {
		return map[string]any{"name": name, "container": map[string]any{"image": "busybox", "command": []any{"sh", "-c", "echo " + msg}}}
	}
	wf := &unstructured.Unstructured{}
	wf.SetGroupVersionKind(argo.WorkflowGVK)
	wf.SetNamespace(namespace)
	wf.SetGenerateName("notify-on-failure-")
	wf.Object["spec"] = map[string]any{
		"entrypoint": "main",
		"onExit":     "exit-handler",
		"podGC":      map[string]any{"strategy": "OnPodCompletion"},
		"templates": []any{
			map[string]any{"name": "main", "steps": []any{[]any{
				map[string]any{"name": "a", "template": "work"},
				map[string]any{"name": second, "template": "work"},
			}}},
			container("work", "working"),
			container("notify-failure", "workflow failed"),
			map[string]any{"name": "exit-handler", "steps": []any{[]any{map[string]any{
				"name": "notify", "template": "notify-failure", "when": "{{workflow.status}} != Succeeded"}}}},
		},
	}
	return wf
}

// tally counts a run's outcomes.
type tally struct {
	succeeded, reproduced, refused, wrongDenials, failedNotified, failed int
	// falseFailedEvents: succeeding workflows with a WorkflowFailed Event; failedEventKept:
	// failing workflows that kept theirs.
	falseFailedEvents, failedEventKept int
	// falseMetric: succeeding workflows whose workflow-level "not succeeded" counter moved
	// (with scenario.metrics).
	falseMetric int
	// staleRefusals are the refusals of the succeeding workflows' stale copies (Event
	// occurrences), and longestSpan the longest time from a workflow's first to its last.
	staleRefusals int
	longestSpan   time.Duration
}

func count(outs []outcome) tally {
	var t tally
	for _, o := range outs {
		if o.wantFail {
			t.failed++
			if o.realNotices > 0 {
				t.failedNotified++
			}
			if o.failedEvents > 0 {
				t.failedEventKept++
			}
			t.wrongDenials += o.denials
			continue
		}
		if o.failedEvents > 0 {
			t.falseFailedEvents++
		}
		if o.workflowMetric > 0 {
			t.falseMetric++
		}
		t.staleRefusals += o.refusals
		t.longestSpan = max(t.longestSpan, o.refusalSpan)
		if o.phase == argo.PhaseSucceeded {
			t.succeeded++
		}
		if o.phase == argo.PhaseSucceeded && o.notifyPods > 0 {
			t.reproduced++
		}
		if o.denials > 0 {
			t.refused++
		}
	}
	return t
}

func report(t *testing.T, what string, outs []outcome) tally {
	t.Helper()
	c := count(outs)
	for _, o := range outs {
		t.Logf("  %s: phase %s, notification pods %d (before its completion %d), WorkflowFailed Events %d, denial Events %d, refusals logged %d over %v, workflow metric %v (should fail: %v)",
			o.name, o.phase, o.notifyPods, o.realNotices, o.failedEvents, o.denials, o.refusals, o.refusalSpan.Round(time.Millisecond), o.workflowMetric, o.wantFail)
	}
	t.Logf("RESULT %s: %d succeeding workflows (%d ended Succeeded), false notification sent %d, false WorkflowFailed Event kept %d, "+
		"workflow-level user metric moved %d, stale attempts refused %d (%d refusals, the longest from first to last %v); "+
		"%d failing workflows, notified %d, WorkflowFailed Event kept %d; wrong denials %d",
		what, len(outs)-c.failed, c.succeeded, c.reproduced, c.falseFailedEvents, c.falseMetric, c.refused, c.staleRefusals,
		c.longestSpan.Round(time.Millisecond), c.failed, c.failedNotified, c.failedEventKept, c.wrongDenials)
	return c
}

func TestExposedControllerSendsTheFalseNoticeAndTheGuardRefusesIt(t *testing.T) {
	n := tries(t)
	// Without the guard, then with it but its Event rule off: nothing refuses the stale pass's
	// WorkflowFailed Event, so the refused pod alone (a 429, which Argo retries) must keep the
	// pass from a terminal phase. At the e2e's requeue (1 s), and at Argo's default (10 s).
	for _, requeue := range []string{"1s", "10s"} {
		env := []string{"DEFAULT_REQUEUE_TIME=" + requeue}
		var without tally
		name := "v3.4.17 without the guard, requeue " + requeue
		t.Run(name, func(t *testing.T) {
			without = report(t, name, runScenario(t, scenario{version: "v3.4.17", mode: noGuard, ok: n, metrics: true, env: env}))
			if requeue == "1s" && without.reproduced == 0 {
				t.Errorf("the stale exit handler was not reproduced in %d tries: the proof below proves nothing", n)
			}
		})
		name = "v3.4.17 with the guard, its Event rule off, requeue " + requeue
		t.Run(name, func(t *testing.T) {
			c := report(t, name, runScenario(t, scenario{version: "v3.4.17", mode: guardNoEventRule, ok: n, metrics: true, env: env}))
			if c.reproduced != 0 {
				t.Errorf("%d false notifications went out with the guard on", c.reproduced)
			}
			if without.reproduced > 0 && c.refused == 0 {
				t.Errorf("no stale attempt was refused in %d tries: the guard was not shown at work", n)
			}
			if c.falseFailedEvents > without.falseFailedEvents || c.falseMetric > without.falseMetric {
				t.Errorf("with the guard: %d false WorkflowFailed Events and %d user metrics moved, without it %d and %d: a refused stale pass still fails the workflow in Argo's memory",
					c.falseFailedEvents, c.falseMetric, without.falseFailedEvents, without.falseMetric)
			}
		})
	}
	for _, mode := range []guardMode{guardDirect, guardLagging} {
		name := map[guardMode]string{guardDirect: "v3.4.17 with the guard", guardLagging: "v3.4.17 with the guard, its watch lagging too"}[mode]
		t.Run(name, func(t *testing.T) {
			c := report(t, name, run(t, "v3.4.17", mode, n, 1))
			checkGuarded(t, c, n, true)
		})
	}
}

// checkGuarded checks a run with the guard on: no false notification and no false
// WorkflowFailed Event for any of the n succeeding workflows, a stale attempt refused (when
// shown is set: on a controller that reproduces the bug in every run), and the failing
// workflows keeping both their notification and their WorkflowFailed Event.
func checkGuarded(t *testing.T, c tally, n int, shown bool) {
	t.Helper()
	if c.reproduced != 0 {
		t.Errorf("%d false notifications went out with the guard on", c.reproduced)
	}
	if c.falseFailedEvents != 0 {
		t.Errorf("%d succeeding workflows kept a false WorkflowFailed Event with the guard on", c.falseFailedEvents)
	}
	if c.succeeded != n {
		t.Errorf("%d of %d workflows ended Succeeded", c.succeeded, n)
	}
	if shown && c.refused == 0 {
		t.Errorf("no stale attempt was refused in %d tries: the guard was not shown at work", n)
	}
	if c.wrongDenials != 0 || c.failedNotified != c.failed || c.failedEventKept != c.failed {
		t.Errorf("failing workflows: %d of %d notified, %d kept their WorkflowFailed Event, %d wrong denials", c.failedNotified, c.failed, c.failedEventKept, c.wrongDenials)
	}
}

func TestFixedControllerNeedsNoGuard(t *testing.T) {
	c := report(t, "v3.7.18 with the guard", run(t, "v3.7.18", guardDirect, tries(t), 1))
	if c.reproduced != 0 || c.refused != 0 {
		t.Errorf("v3.7.18: %d false notifications, %d refusals; want none", c.reproduced, c.refused)
	}
	if c.wrongDenials != 0 || c.failedNotified != c.failed {
		t.Errorf("failing workflows: %d of %d notified, %d wrong denials", c.failedNotified, c.failed, c.wrongDenials)
	}
}

func TestV4Controller(t *testing.T) {
	n := tries(t)
	without := report(t, "v4.0.5 without the guard", run(t, "v4.0.5", noGuard, n, 0))
	with := report(t, "v4.0.5 with the guard", run(t, "v4.0.5", guardDirect, n, 1))
	if with.reproduced != 0 {
		t.Errorf("%d false notifications went out with the guard on", with.reproduced)
	}
	if with.wrongDenials != 0 || with.failedNotified != with.failed {
		t.Errorf("failing workflows: %d of %d notified, %d wrong denials", with.failedNotified, with.failed, with.wrongDenials)
	}
	t.Logf("v4.0.5 exposed in this run: %v (%d of %d without the guard)", without.reproduced > 0, without.reproduced, n)
}

// The WorkflowFailed Event of a stale copy, and the failure metrics of its pass, on the other
// exposed controllers: v3.6.18 (3.6 never got upstream's fix; it holds the terminal phase back
// while a task result is incomplete) and v4.0.5 with INFORMER_WRITE_BACK=true (the 3.x cache
// behaviour). Each reported without the guard, with the guard but its Event rule off (the
// refused pod alone, a 429, must keep the stale pass from a terminal phase: no more false
// Events, user metrics or argo_workflows_total_count than without the guard), and with
// everything on.
func TestFailureEventsOnOtherExposedControllers(t *testing.T) {
	n := tries(t)
	for _, c := range []struct {
		version, name string
		env           []string
	}{{"v3.6.18", "v3.6.18", nil}, {"v4.0.5", "v4.0.5 INFORMER_WRITE_BACK=true", []string{"INFORMER_WRITE_BACK=true"}}} {
		t.Run(c.name, func(t *testing.T) {
			var without tally
			var withoutTotal float64
			for _, mode := range []guardMode{noGuard, guardNoEventRule} {
				what := c.name + map[guardMode]string{noGuard: " without the guard", guardNoEventRule: " with the guard, its Event rule off"}[mode]
				tot := &totals{}
				outs := runScenario(t, scenario{version: c.version, mode: mode, ok: n, failing: 1, env: c.env, metrics: true, totals: tot})
				got := report(t, what, outs)
				// The failing workflow counts in argo_workflows_total_count once for each pass
				// that marked it failed, its stale copies' among them, as its own counter does:
				// what is left is the count of the succeeding workflows' stale passes.
				var failing float64
				for _, o := range outs {
					if o.wantFail && o.workflowMetric == 0 {
						t.Errorf("the failing workflow's own counter did not move: the controller's metrics were not read, and the figures of the others say nothing")
					}
					if o.wantFail {
						failing += o.workflowMetric
					}
				}
				total := tot.failedOrErrorAdded() - failing
				if tot.after.failedOrError == nil {
					total = 0 // 3.4: no such series
				}
				t.Logf("RESULT %s: argo_workflows_total_count{phase=~\"Failed|Error\"} moved by the succeeding workflows' stale passes: %v (the failing workflow's passes: %v; before the first workflow: %v; at the end: %v)",
					what, total, failing, tot.before, tot.after)
				if mode == noGuard {
					without, withoutTotal = got, total
					continue
				}
				if got.reproduced != 0 {
					t.Errorf("%d false notifications went out with the guard on", got.reproduced)
				}
				if got.falseFailedEvents > without.falseFailedEvents || got.falseMetric > without.falseMetric || total > withoutTotal {
					t.Errorf("with the guard: %d false WorkflowFailed Events, %d user metrics moved, argo_workflows_total_count +%v; without it %d, %d, +%v",
						got.falseFailedEvents, got.falseMetric, total, without.falseFailedEvents, without.falseMetric, withoutTotal)
				}
			}
			with := report(t, c.name+" with the guard", runScenario(t, scenario{version: c.version, mode: guardDirect, ok: n, failing: 1, env: c.env}))
			checkGuarded(t, with, n, false)
			t.Logf("%s: stale attempts refused for %d of %d workflows", c.name, with.refused, n)
		})
	}
}
