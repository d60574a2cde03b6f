//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// runThroughput runs one batch of mix under config and load, on a fresh API server.
func runThroughput(t *testing.T, version, config, load, mix string, p throughputParams, loadBin string) throughputRun {
	t.Helper()
	ctrlBin, crds := controller(t, version)
	opts := testenv.Options{CRDDirs: []string{crds}, OwnCRDs: true}
	vwc := chartWebhook(t)
	switch config {
	case noWebhook:
	case "live-GET peer":
		// The peer is sent every pod of the namespace, as a policy engine's webhook is.
		for _, w := range vwc.Webhooks {
			if len(w.Rules) > 0 && slices.Contains(w.Rules[0].Resources, "pods") {
				w := *w.DeepCopy()
				w.MatchConditions, w.ObjectSelector = nil, nil
				opts.ValidatingWebhooks = []*admissionregistrationv1.ValidatingWebhookConfiguration{{
					ObjectMeta: metav1.ObjectMeta{Name: "live-get-peer"}, Webhooks: []admissionregistrationv1.ValidatingWebhook{w}}}
			}
		}
	default:
		opts.ValidatingWebhooks = []*admissionregistrationv1.ValidatingWebhookConfiguration{vwc}
	}
	env, ctx, stop := startAPIServer(t, opts, map[string]string{"parallelism": strconv.Itoa(p.parallelism)},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bulk"}})
	defer stop()
	c := env.Client

	// server is the webhook's process, whose CPU time the batch reads.
	var server *testenv.Process
	var guard *testenv.Guard
	switch {
	case config == "exit-guard" || strings.HasPrefix(config, "exit-guard --"):
		args := []string{"--webhook-port=" + strconv.Itoa(env.WebhookPort), "--webhook-cert-path=" + env.WebhookCertDir, "--shutdown-delay=0s"}
		args = append(args, strings.Fields(config)[1:]...)
		out := &testenv.Output{}
		g, err := testenv.StartGuard(ctx, guardBin, env.KubeConfig(), args, out)
		if err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		defer func() { _ = g.Stop() }()
		server, guard = g.Process, g
	case config == doNothing || config == "live-GET peer":
		kc := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
			t.Fatal(err)
		}
		probe, err := testenv.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		// The do-nothing webhook is test/load's floor as controller-runtime serves it (the
		// guard's server and decoding, no decision), on every path of the chart's webhooks.
		args := []string{"floor", "--kind=controller-runtime"}
		if config == "live-GET peer" {
			args = []string{"liveget"}
		}
		peer, err := testenv.Launch(loadBin, append(args, "--addr="+env.WebhookHost+":"+strconv.Itoa(env.WebhookPort),
			"--cert-dir="+env.WebhookCertDir, "--probe="+probe), append(os.Environ(), "KUBECONFIG="+kc), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer peer.Kill()
		if _, err := peer.WaitReady(ctx, "http://"+probe+"/readyz", 200*time.Millisecond, 90*time.Second); err != nil {
			t.Fatalf("the %s: %v", config, err)
		}
		server = peer
	}

	logDir := t.TempDir()
	k := newKubelet(c, namespace)
	notify := newNotifier()
	defer notify.close()
	var err error
	if k.agents, err = newAgents(filepath.Join(filepath.Dir(ctrlBin), "argoexec"), env.Config, namespace, logDir); err != nil {
		t.Fatal(err)
	}
	defer k.agents.stop()
	go k.run(ctx)

	kcFile := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kcFile, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(logDir, "controller.log")
	logOut, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logOut.Close() }()
	// E2E_THROUGHPUT_LOGLEVEL (with E2E_THROUGHPUT_LOGS) logs each pass: info names each
	// workflow processed.
	level := cmp.Or(os.Getenv("E2E_THROUGHPUT_LOGLEVEL"), "warn")
	ctrl := launchController(t, ctrlBin, kcFile, level, nil, nil, logOut)
	defer func() { _ = ctrl.Stop(controllerGrace) }()

	stopLoad := func() {}
	if load == "loaded" {
		stopLoad = loadAPIServer(ctx, t, c)
	}
	defer stopLoad()
	// The controller serves its metrics before its workers run: a batch created then would reach
	// it all at once when they start, and be processed in one burst (its queue waiting on the
	// burst, as seen in batches whose controller started slowly beside the guard's start). It
	// is ready once it has judged a workflow: one it must find invalid on its first pass.
	if err := waitControllerMetrics(ctx); err != nil {
		logs, _ := os.ReadFile(logFile)
		t.Fatalf("%s: the controller never served its metrics: %v\ncontroller log:\n%s", version, err, tail(logs, 40))
	}
	if err := waitControllerWorking(ctx, c); err != nil {
		logs, _ := os.ReadFile(logFile)
		t.Fatalf("%s: the controller never judged a workflow: %v\ncontroller log:\n%s", version, err, tail(logs, 40))
	}
	before := webhookCalls(ctx, t, env)
	readsBefore := workflowReads(ctx, t, env)
	var served0 time.Duration
	if server != nil {
		if served0, err = server.CPU(); err != nil {
			t.Fatal(err)
		}
	}

	created := map[string]time.Time{}
	var wfs []*unstructured.Unstructured
	start := time.Now()
	for i := range p.workflows {
		wf := throughputWorkflow(i, mix, notify)
		if err := c.Create(ctx, wf); err != nil {
			t.Fatal(err)
		}
		created[wf.GetName()] = time.Now()
		wfs = append(wfs, wf)
	}
	doneAt, runningAt := map[string]time.Time{}, map[string]time.Time{}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(argo.WorkflowListGVK)
		if err := c.List(ctx, &list, client.InNamespace(namespace)); err == nil {
			now := time.Now()
			for _, wf := range list.Items {
				if _, ours := created[wf.GetName()]; !ours {
					continue // the warm-up workflow, on its way out
				}
				ph, _, _ := unstructured.NestedString(wf.Object, "status", "phase")
				if _, seen := runningAt[wf.GetName()]; !seen && (argo.Phase(ph) == argo.PhaseRunning || argo.Phase(ph).Terminal()) {
					runningAt[wf.GetName()] = now
				}
				if _, seen := doneAt[wf.GetName()]; !seen && argo.Phase(ph).Terminal() {
					doneAt[wf.GetName()] = now
					if argo.Phase(ph) != argo.PhaseSucceeded {
						msg, _, _ := unstructured.NestedString(wf.Object, "status", "message")
						t.Errorf("%s, %s, %s mix, %s: workflow %s ended %s (%s): a throughput run must not fail a workflow", version, load, mix, config, wf.GetName(), ph, msg)
					}
				}
			}
		}
		return len(doneAt) == len(wfs), nil
	})
	if err != nil {
		logs, _ := os.ReadFile(logFile)
		t.Fatalf("%s, %s, %s mix, %s: %d of %d workflows completed within 10 minutes (%v)\ncontroller log:\n%s", version, load, mix, config, len(doneAt), len(wfs), err, tail(logs, 40))
	}
	r := throughputRun{config: config, load: load, mix: mix}
	if server != nil {
		served1, err := server.CPU()
		if err != nil {
			t.Fatal(err)
		}
		r.served = served1 - served0
	}
	var last time.Time
	for name, at := range doneAt {
		r.done = append(r.done, at.Sub(created[name]))
		r.held = append(r.held, at.Sub(runningAt[name]))
		if at.After(last) {
			last = at
		}
	}
	r.perMinute = float64(len(wfs)) / last.Sub(start).Minutes()
	r.byHook = map[string]hookCalls{}
	var sum float64
	for name, after := range webhookCalls(ctx, t, env) {
		d := hookCalls{count: after.count - before[name].count, seconds: after.seconds - before[name].seconds}
		if d.count > 0 {
			r.byHook[name] = d
			r.calls += d.count
			sum += d.seconds
		}
	}
	if r.calls > 0 {
		r.callMean = time.Duration(sum / r.calls * float64(time.Second))
	}
	if guard != nil {
		r.decisions = guardDecisions(ctx, t, guard)
	}
	r.reads = map[string]hookCalls{}
	for verb, after := range workflowReads(ctx, t, env) {
		r.reads[verb] = hookCalls{count: after.count - readsBefore[verb].count, seconds: after.seconds - readsBefore[verb].seconds}
	}
	if mfs, err := scrapeController(ctx); err == nil {
		r.queueAdds, r.queueWait, r.queueSpread = workflowQueue(mfs)
		r.operations, r.operationMean, r.operationSpread = operations(mfs)
	} else {
		t.Errorf("reading the controller's metrics: %v", err)
	}
	// E2E_THROUGHPUT_LOGS keeps each batch's controller log, to follow one workflow's passes.
	if dir := os.Getenv("E2E_THROUGHPUT_LOGS"); dir != "" {
		logs, err := os.ReadFile(logFile)
		kept := filepath.Join(dir, fmt.Sprintf("%s-%s-%s-%s-%d.log", version, load, mix, strings.ReplaceAll(config, " ", "-"), start.UnixNano()))
		if err == nil {
			err = os.WriteFile(kept, logs, 0o600)
		}
		if err != nil {
			t.Errorf("keeping the controller's log: %v", err)
		} else {
			t.Logf("the controller's log of this batch: %s", kept)
		}
	}
	return r
}

// hookCalls is how many calls the API server made to one webhook, and how long they took in all.
type hookCalls struct{ count, seconds float64 }

// webhookCalls reads, from the API server's own histogram, how many calls it made to each
// webhook (by its name) and how long they took in all.
func webhookCalls(ctx context.Context, t *testing.T, env *testenv.Env) map[string]hookCalls {
	mfs, err := env.APIServerMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]hookCalls{}
	for _, m := range mfs["apiserver_admission_webhook_admission_duration_seconds"].GetMetric() {
		name := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "name" {
				name = l.GetValue()
			}
		}
		c := calls[name]
		c.count += float64(m.GetHistogram().GetSampleCount())
		c.seconds += m.GetHistogram().GetSampleSum()
		calls[name] = c
	}
	return calls
}

// workflowReads reads, from the API server's apiserver_request_duration_seconds, how many GETs
// and LISTs of Workflows it served (the guard's live reads and the controller's own) and how
// long they took in all, by verb.
func workflowReads(ctx context.Context, t *testing.T, env *testenv.Env) map[string]hookCalls {
	mfs, err := env.APIServerMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reads := map[string]hookCalls{}
	for _, m := range mfs["apiserver_request_duration_seconds"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["resource"] != argo.Resource || labels["subresource"] != "" || (labels["verb"] != "GET" && labels["verb"] != "LIST") {
			continue
		}
		c := reads[labels["verb"]]
		c.count += float64(m.GetHistogram().GetSampleCount())
		c.seconds += m.GetHistogram().GetSampleSum()
		reads[labels["verb"]] = c
	}
	return reads
}

// workflowQueue reads the controller's workflow queue from its metrics: items added, the mean
// time an item waited (argo_workflows_queue_adds_count and argo_workflows_queue_latency of queue
// workflow_queue, as v3.4 to v4.0 name them), and how the waits spread over the histogram's
// buckets ("n ≤ bound" per bucket that gained items), which tells a few long waits from many
// short ones.
func workflowQueue(mfs map[string]*dto.MetricFamily) (adds float64, wait time.Duration, spread string) {
	isWorkflowQueue := func(m *dto.Metric) bool {
		for _, l := range m.GetLabel() {
			if (l.GetName() == "queue_name" || l.GetName() == "name") && l.GetValue() == "workflow_queue" {
				return true
			}
		}
		return false
	}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if !isWorkflowQueue(m) {
				continue
			}
			switch {
			case strings.HasPrefix(name, "argo_workflows_queue_adds"):
				adds += m.GetCounter().GetValue()
			case strings.HasPrefix(name, "argo_workflows_queue_latency") && m.GetHistogram().GetSampleCount() > 0:
				_, wait, spread = histogramOf(m.GetHistogram())
			}
		}
	}
	return adds, wait, spread
}

// operations reads how long the controller's passes over a workflow (operate) took, from
// argo_workflows_operation_duration_seconds: how many, their mean, and their spread over the
// histogram's buckets. A key added again while its pass runs waits in the queue until the pass
// ends: with Argo's requeue delay shorter than a pass, the queue's wait grows with the passes.
func operations(mfs map[string]*dto.MetricFamily) (n float64, mean time.Duration, spread string) {
	for _, m := range mfs["argo_workflows_operation_duration_seconds"].GetMetric() {
		if h := m.GetHistogram(); h.GetSampleCount() > 0 {
			return histogramOf(h)
		}
	}
	return 0, 0, ""
}

// histogramOf is a histogram's count, mean, and spread over its buckets ("n ≤ bound" for each
// bucket that holds any).
func histogramOf(h *dto.Histogram) (n float64, mean time.Duration, spread string) {
	var parts []string
	below := uint64(0)
	for _, b := range h.GetBucket() {
		if c := b.GetCumulativeCount() - below; c > 0 {
			parts = append(parts, fmt.Sprintf("%d ≤ %s", c, time.Duration(b.GetUpperBound()*float64(time.Second))))
		}
		below = b.GetCumulativeCount()
	}
	if c := h.GetSampleCount() - below; c > 0 {
		parts = append(parts, fmt.Sprintf("%d above", c))
	}
	return float64(h.GetSampleCount()), time.Duration(h.GetSampleSum() / float64(h.GetSampleCount()) * float64(time.Second)), strings.Join(parts, ", ")
}

// loadAPIServer starts other clients on the API server: each lists 300 workflows of 30 KB in
// namespace bulk whole, again and again, and writes one; the controller, namespaced, does not
// reconcile them.
func loadAPIServer(ctx context.Context, t *testing.T, c client.Client) (stop func()) {
	t.Helper()
	pad := strings.Repeat("x", 30000)
	for i := range 300 {
		wf := &unstructured.Unstructured{}
		wf.SetGroupVersionKind(argo.WorkflowGVK)
		wf.SetNamespace("bulk")
		wf.SetName("bulk-" + strconv.Itoa(i))
		wf.Object["spec"] = map[string]any{"entrypoint": "main", "templates": []any{map[string]any{"name": "main", "container": map[string]any{"image": pad}}}}
		if err := c.Create(ctx, wf); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				var list unstructured.UnstructuredList
				list.SetGroupVersionKind(argo.WorkflowListGVK)
				_ = c.List(ctx, &list, client.InNamespace("bulk"))
				if len(list.Items) > 0 {
					wf := &list.Items[(w*7919+i)%len(list.Items)]
					wf.SetAnnotations(map[string]string{"load": strconv.Itoa(i)})
					_ = c.Update(ctx, wf)
				}
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

// guardDecisions says what the guard decided over the batch, from its own metrics: its decisions
// by kind, verdict and reason, and its live reads (how many, their mean).
func guardDecisions(ctx context.Context, t *testing.T, g *testenv.Guard) string {
	t.Helper()
	mfs, err := g.Metrics(ctx)
	if err != nil {
		t.Errorf("reading the guard's metrics: %v", err)
		return ""
	}
	var parts []string
	for _, m := range mfs["exit_guard_decisions_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if n := m.GetCounter().GetValue(); n > 0 {
			parts = append(parts, fmt.Sprintf("%s %s %s %.0f", labels["kind"], labels["verdict"], labels["reason"], n))
		}
	}
	slices.Sort(parts)
	var reads, sum float64
	for _, m := range mfs["exit_guard_live_read_duration_seconds"].GetMetric() {
		reads += float64(m.GetHistogram().GetSampleCount())
		sum += m.GetHistogram().GetSampleSum()
	}
	mean := time.Duration(0)
	if reads > 0 {
		mean = time.Duration(sum / reads * float64(time.Second))
	}
	return fmt.Sprintf("%s; live reads %.0f, mean %s", strings.Join(parts, ", "), reads, mean.Round(10*time.Microsecond))
}

// waitControllerWorking creates a workflow whose entrypoint names no template, waits until the
// controller has marked it ended (its first pass finds the spec invalid), and deletes it: the
// controller's workers run.
func waitControllerWorking(ctx context.Context, c client.Client) error {
	wf := &unstructured.Unstructured{}
	wf.SetGroupVersionKind(argo.WorkflowGVK)
	wf.SetNamespace(namespace)
	wf.SetGenerateName("tp-warm-up-")
	wf.Object["spec"] = map[string]any{"entrypoint": "none", "templates": []any{map[string]any{"name": "x", "container": map[string]any{"image": "x"}}}}
	if err := c.Create(ctx, wf); err != nil {
		return err
	}
	defer func() { _ = c.Delete(context.WithoutCancel(ctx), wf) }()
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(wf), wf); err != nil {
			return false, nil //nolint:nilerr // not yet readable: try again
		}
		ph, _, _ := unstructured.NestedString(wf.Object, "status", "phase")
		return argo.Phase(ph).Terminal(), nil
	})
}
