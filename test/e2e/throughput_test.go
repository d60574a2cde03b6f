//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

// What Argo's own throughput is with and without a webhook in front of its writes: a batch of
// workflows of a realistic mix, created at once, run by the real controller (watching the API
// server directly: no stale copies are provoked here) under a parallelism limit, with the
// kubelet stand-in and Argo's real agent; once on an idle API server and once with other
// clients loading it. The configurations alternate in a random order within each round, so
// that this shared machine's drift hits them alike; the report gives each one's ratio to no
// webhook in the same round, with its spread over the rounds. `make e2e-throughput` runs it at
// length (docs/evidence/performance.md); `make e2e-argo` runs one short round.

// throughputConfigs are the configurations compared: no webhook, the guard as the chart
// installs it (default and --store-first), and the live-GET peer (pods only).
var throughputConfigs = []string{"no webhook", "exit-guard", "exit-guard --store-first", "exit-guard --taskset-repeats-for=-1s", "live-GET peer"}

// throughputParams are the run's sizes, from the environment (make e2e-throughput).
type throughputParams struct {
	versions    []string
	workflows   int
	parallelism int
	rounds      int
	loads       []string
	configs     []string
	report      string
}

func throughputFromEnv(t *testing.T) throughputParams {
	t.Helper()
	p := throughputParams{versions: []string{"v3.4.17"}, workflows: 8, parallelism: 4, rounds: 1, loads: []string{"idle"},
		configs: []string{"no webhook", "exit-guard"}, report: os.Getenv("E2E_THROUGHPUT_REPORT")}
	num := func(name string, into *int) {
		if s := os.Getenv(name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive number", name, s)
			}
			*into = n
		}
	}
	list := func(name string, into *[]string, allowed []string) {
		if s := os.Getenv(name); s != "" {
			*into = nil
			for _, f := range strings.Split(s, ",") {
				f = strings.TrimSpace(f)
				if allowed != nil && !slices.Contains(allowed, f) {
					t.Fatalf("%s: %q is not one of %q", name, f, allowed)
				}
				*into = append(*into, f)
			}
		}
	}
	num("E2E_THROUGHPUT_WORKFLOWS", &p.workflows)
	num("E2E_THROUGHPUT_PARALLELISM", &p.parallelism)
	num("E2E_THROUGHPUT_ROUNDS", &p.rounds)
	list("E2E_THROUGHPUT_VERSIONS", &p.versions, nil)
	list("E2E_THROUGHPUT_LOADS", &p.loads, []string{"idle", "loaded"})
	list("E2E_THROUGHPUT_CONFIGS", &p.configs, throughputConfigs)
	if !slices.Contains(p.configs, "no webhook") {
		t.Fatal("E2E_THROUGHPUT_CONFIGS must include \"no webhook\": every ratio is to it")
	}
	return p
}

// throughputRun is what one batch measured.
type throughputRun struct {
	config, load string
	round        int
	// perMinute: workflows completed per minute, from the first create to the last completion.
	perMinute float64
	// done: from each workflow's create to its completion as the test's poll saw it; held:
	// from when the poll first saw it Running (past the parallelism limit, which keeps it
	// Pending) to its completion: the time it held one of the parallelism's slots.
	done []time.Duration
	held []time.Duration
	// calls: the webhook calls the API server made for the batch, and their mean duration;
	// byHook: the calls of each webhook (pods, TaskSets, Events, the peer's) and the time
	// Argo's writes waited on them in all.
	calls    float64
	callMean time.Duration
	byHook   map[string]hookCalls
	// queue: the controller's workflow queue, from its own metrics: items added, and the mean
	// time an item waited in it; workers busy on average is not exported by every version.
	queueAdds float64
	queueWait time.Duration
}

func TestArgoThroughput(t *testing.T) {
	p := throughputFromEnv(t)
	runs.Add(1)
	loadBin := ""
	if slices.Contains(p.configs, "live-GET peer") {
		loadBin = filepath.Join(t.TempDir(), "load")
		cmd := exec.Command("go", "build", "-o", loadBin, "./test/load") //nolint:gosec // G204: this repository's own tool
		cmd.Dir = testenv.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the live-GET peer (test/load): %v\n%s", err, out)
		}
	}
	var report strings.Builder
	for _, version := range p.versions {
		var all []throughputRun
		for round := range p.rounds {
			for _, load := range p.loads {
				order := slices.Clone(p.configs)
				rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] }) //nolint:gosec // G404: an order of runs, not a secret
				for _, config := range order {
					r := runThroughput(t, version, config, load, p, loadBin)
					r.round = round
					all = append(all, r)
					var hooks []string
					for name, h := range r.byHook {
						hooks = append(hooks, fmt.Sprintf("%s %.0f in %s", name, h.count, time.Duration(h.seconds*float64(time.Second)).Round(time.Millisecond)))
					}
					slices.Sort(hooks)
					t.Logf("%s, %s, %s, round %d: %.2f workflows/min, create to done p50 %s p99 %s; webhook calls %.0f (mean %s; %s); controller queue adds %.0f, mean wait %s",
						version, load, config, round+1, r.perMinute, q(r.done, 0.5), q(r.done, 0.99), r.calls, r.callMean.Round(10*time.Microsecond), strings.Join(hooks, ", "),
						r.queueAdds, r.queueWait.Round(10*time.Microsecond))
				}
			}
		}
		writeThroughputReport(&report, version, p, all)
		// Written after each version, so that a later version's failure keeps this one's.
		if p.report != "" {
			if err := os.WriteFile(p.report, []byte(report.String()), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Log("\n" + report.String())
}

// q is the quantile at f of d.
func q(d []time.Duration, f float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(f*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))].Round(10 * time.Millisecond)
}

// writeThroughputReport writes two Markdown tables per load. The first, for each configuration:
// the median over the rounds of its workflows per minute and of its ratio to no webhook in the
// same round, the ratios' geometric mean with its 95% interval (Student's t over the rounds;
// from two rounds) and their lowest and highest, create-to-done p50 and p99 over every
// workflow of every round, the mean time a workflow held a parallelism slot, the webhook
// calls, the time Argo's writes waited on webhooks per workflow and as a share of the slot
// time (under a parallelism limit the rate is the slots over the mean time a workflow holds
// one: that share bounds what the calls take from it), and the controller's queue figures. The second splits the
// calls by webhook.
func writeThroughputReport(w *strings.Builder, version string, p throughputParams, all []throughputRun) {
	for _, load := range p.loads {
		fmt.Fprintf(w, "\n**%s, API server %s**: %d workflows per batch, parallelism %d, %d round(s)\n\n", version, load, p.workflows, p.parallelism, p.rounds)
		fmt.Fprintln(w, "| configuration | workflows/min (median) | ratio to no webhook (median) | ratio, geometric mean (95% interval) | ratio, lowest to highest | create to done p50 | p99 | slot held (mean) | webhook calls per batch | mean call | webhook wait per workflow | share of slot time | controller queue adds | mean queue wait |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
		base := map[int]float64{}
		for _, r := range all {
			if r.load == load && r.config == "no webhook" {
				base[r.round] = r.perMinute
			}
		}
		hooks, runsOf := map[string]map[string]hookCalls{}, map[string]int{}
		for _, config := range p.configs {
			var rates, ratios []float64
			var done []time.Duration
			var calls, adds, waited, heldSum float64
			var callMean, wait time.Duration
			n := 0
			for _, r := range all {
				if r.load != load || r.config != config {
					continue
				}
				n++
				rates = append(rates, r.perMinute)
				if b := base[r.round]; b > 0 {
					ratios = append(ratios, r.perMinute/b)
				}
				done = append(done, r.done...)
				for _, d := range r.held {
					heldSum += d.Seconds()
				}
				calls, adds, callMean, wait = calls+r.calls, adds+r.queueAdds, callMean+r.callMean, wait+r.queueWait
				if hooks[config] == nil {
					hooks[config] = map[string]hookCalls{}
				}
				for name, h := range r.byHook {
					waited += h.seconds
					a := hooks[config][name]
					a.count, a.seconds = a.count+h.count, a.seconds+h.seconds
					hooks[config][name] = a
				}
			}
			if n == 0 {
				continue
			}
			runsOf[config] = n
			slices.Sort(ratios)
			spread, interval := "-", "-"
			if len(ratios) > 0 {
				spread = fmt.Sprintf("%.3f to %.3f", ratios[0], ratios[len(ratios)-1])
				if config != "no webhook" && len(ratios) > 1 {
					m, lo, hi := geometricInterval(ratios)
					interval = fmt.Sprintf("%.3f (%.3f to %.3f)", m, lo, hi)
				}
			}
			perWorkflow, share := 0.0, 0.0
			if len(done) > 0 {
				perWorkflow = waited / float64(len(done))
				share = waited / heldSum
			}
			fmt.Fprintf(w, "| %s | %.2f | %.3f | %s | %s | %s | %s | %s | %.0f | %s | %s | %.2f%% | %.0f | %s |\n", config, median(rates), median(ratios), interval, spread,
				q(done, 0.5), q(done, 0.99), time.Duration(heldSum/float64(max(1, len(done)))*float64(time.Second)).Round(10*time.Millisecond), calls/float64(n), (callMean / time.Duration(n)).Round(10*time.Microsecond),
				time.Duration(perWorkflow*float64(time.Second)).Round(100*time.Microsecond), 100*share, adds/float64(n),
				(wait / time.Duration(n)).Round(10*time.Microsecond))
		}
		fmt.Fprintf(w, "\nCalls by webhook, per batch (mean over the rounds), %s, API server %s:\n\n", version, load)
		fmt.Fprintln(w, "| configuration | webhook | calls per batch | mean call | waited per batch |")
		fmt.Fprintln(w, "|---|---|---|---|---|")
		for _, config := range p.configs {
			names := make([]string, 0, len(hooks[config]))
			for name := range hooks[config] {
				names = append(names, name)
			}
			slices.Sort(names)
			for _, name := range names {
				h := hooks[config][name]
				// Over the runs of the configuration: a webhook no call reached in a run
				// counts that run as 0.
				h.count, h.seconds = h.count/float64(runsOf[config]), h.seconds/float64(runsOf[config])
				mean := time.Duration(0)
				if h.count > 0 {
					mean = time.Duration(h.seconds / h.count * float64(time.Second))
				}
				fmt.Fprintf(w, "| %s | %s | %.1f | %s | %s |\n", config, name, h.count, mean.Round(10*time.Microsecond),
					time.Duration(h.seconds*float64(time.Second)).Round(time.Millisecond))
			}
		}
	}
}

// geometricInterval is the geometric mean of ratios with its 95% interval: the mean of their
// logarithms plus or minus Student's t for len(ratios)-1 degrees of freedom times its standard
// error. With one ratio the interval is that ratio.
func geometricInterval(ratios []float64) (mean, lo, hi float64) {
	n := float64(len(ratios))
	var sum, sq float64
	for _, r := range ratios {
		sum += math.Log(r)
	}
	m := sum / n
	if len(ratios) < 2 {
		return math.Exp(m), math.Exp(m), math.Exp(m)
	}
	for _, r := range ratios {
		sq += (math.Log(r) - m) * (math.Log(r) - m)
	}
	half := studentT975(len(ratios)-1) * math.Sqrt(sq/(n-1)) / math.Sqrt(n)
	return math.Exp(m), math.Exp(m - half), math.Exp(m + half)
}

// studentT975 is the 97.5th percentile of Student's t with df degrees of freedom (df ≥ 1),
// from the usual table; between its rows, the row of the next smaller df (a wider interval).
func studentT975(df int) float64 {
	table := []struct {
		df int
		t  float64
	}{{1, 12.706}, {2, 4.303}, {3, 3.182}, {4, 2.776}, {5, 2.571}, {6, 2.447}, {7, 2.365}, {8, 2.306}, {9, 2.262},
		{10, 2.228}, {12, 2.179}, {15, 2.131}, {20, 2.086}, {30, 2.042}, {60, 2.000}, {120, 1.980}}
	for i := len(table) - 1; i > 0; i-- {
		if df >= table[i].df {
			return table[i].t
		}
	}
	return table[0].t
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// throughputWorkflow is the i-th workflow of the mix: steps with a pod exit handler; a DAG; a
// step that fails once and is retried; HTTP steps with an HTTP exit handler (Argo's agent). Each
// exit handler runs (no `when`): its pod or its TaskSet write is what the guard judges.
func throughputWorkflow(i int, notify *notifier) *unstructured.Unstructured {
	container := func(name string) map[string]any {
		return map[string]any{"name": name, "container": map[string]any{"image": "busybox", "command": []any{"sh", "-c", "echo " + name}}}
	}
	httpTemplate := func(name, url string) map[string]any {
		return map[string]any{"name": name, "http": map[string]any{"url": url, "method": "POST",
			"body": "workflow {{workflow.name}} is {{workflow.status}}", "successCondition": "response.statusCode == 200"}}
	}
	step := func(name, template string) map[string]any { return map[string]any{"name": name, "template": template} }
	var kind string
	var templates []any
	onExit := "exit-handler"
	switch i % 4 {
	case 0:
		kind = "steps"
		templates = []any{
			map[string]any{"name": "main", "steps": []any{[]any{step("s1", "work")}, []any{step("s2", "work"), step("s3", "work")}}},
			container("work"), container("notify"),
			map[string]any{"name": onExit, "steps": []any{[]any{step("notify", "notify")}}},
		}
	case 1:
		kind = "dag"
		templates = []any{
			map[string]any{"name": "main", "dag": map[string]any{"tasks": []any{
				step("d1", "work"),
				map[string]any{"name": "d2", "template": "work", "dependencies": []any{"d1"}},
				map[string]any{"name": "d3", "template": "work", "dependencies": []any{"d1"}},
				map[string]any{"name": "d4", "template": "work", "dependencies": []any{"d2", "d3"}},
			}}},
			container("work"), container("notify"),
			map[string]any{"name": onExit, "steps": []any{[]any{step("notify", "notify")}}},
		}
	case 2:
		kind = "retry"
		flaky := container("flaky")
		flaky["retryStrategy"] = map[string]any{"limit": "2"}
		templates = []any{
			map[string]any{"name": "main", "steps": []any{[]any{step("s1", "work")}, []any{step("flaky", "flaky")}}},
			container("work"), flaky, container("notify"),
			map[string]any{"name": onExit, "steps": []any{[]any{step("notify", "notify")}}},
		}
	default:
		kind = "http"
		templates = []any{
			map[string]any{"name": "main", "steps": []any{[]any{step("s1", "work"), step("ping", "ping")}, []any{step("ping2", "ping")}}},
			container("work"), httpTemplate("ping", notify.pingURL()), httpTemplate("notify", notify.url()),
			map[string]any{"name": onExit, "steps": []any{[]any{step("notify", "notify")}}},
		}
	}
	wf := &unstructured.Unstructured{}
	wf.SetGroupVersionKind(argo.WorkflowGVK)
	wf.SetNamespace(namespace)
	wf.SetGenerateName("tp-" + kind + "-")
	wf.Object["spec"] = map[string]any{"entrypoint": "main", "onExit": onExit, "podGC": map[string]any{"strategy": "OnPodCompletion"}, "templates": templates}
	return wf
}

// runThroughput runs one batch under config and load, on a fresh API server.
func runThroughput(t *testing.T, version, config, load string, p throughputParams, loadBin string) throughputRun {
	t.Helper()
	ctrlBin, crds := controller(t, version)
	opts := testenv.Options{CRDDirs: []string{crds}, OwnCRDs: true}
	helmBin, err := testenv.HelmBin()
	if err != nil {
		t.Fatal(err)
	}
	vwc, err := testenv.ChartWebhook(helmBin)
	if err != nil {
		t.Fatal(err)
	}
	switch config {
	case "no webhook":
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
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bulk"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "default"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "workflow-controller-configmap"},
			Data: map[string]string{"parallelism": strconv.Itoa(p.parallelism)}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	switch config {
	case "exit-guard", "exit-guard --store-first", "exit-guard --taskset-repeats-for=-1s":
		args := []string{"--webhook-port=" + strconv.Itoa(env.WebhookPort), "--webhook-cert-path=" + env.WebhookCertDir, "--shutdown-delay=0s"}
		args = append(args, strings.Fields(config)[1:]...)
		out := &testenv.Output{}
		g, err := testenv.StartGuard(ctx, guardBin, env.KubeConfig(), args, out)
		if err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		defer func() { _ = g.Stop() }()
	case "live-GET peer":
		kc := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
			t.Fatal(err)
		}
		probe, err := testenv.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(loadBin, "liveget", "--addr="+env.WebhookHost+":"+strconv.Itoa(env.WebhookPort), //nolint:gosec // G204: this repository's own tool
			"--cert-dir="+env.WebhookCertDir, "--probe="+probe)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+kc)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		if err := waitHTTP(ctx, "http://"+probe+"/readyz"); err != nil {
			t.Fatalf("the live-GET peer: %v", err)
		}
	}

	logDir := t.TempDir()
	k := newKubelet(c, namespace)
	notify := newNotifier()
	defer notify.close()
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
	cmd := exec.Command(ctrlBin, "--kubeconfig="+kcFile, "--namespaced", "--managed-namespace="+namespace, //nolint:gosec // G204: the controller this repository built
		"--namespace="+namespace, "--executor-image=executor:e2e", "--loglevel=warn")
	cmd.Env = append(os.Environ(), "LEADER_ELECTION_DISABLE=true", "DEFAULT_REQUEUE_TIME=1s")
	cmd.Stdout, cmd.Stderr = logOut, logOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
		}
	}()

	stopLoad := func() {}
	if load == "loaded" {
		stopLoad = loadAPIServer(ctx, t, c)
	}
	defer stopLoad()
	// The controller is ready once its metrics answer.
	if err := waitHTTP(ctx, ""); err != nil {
		logs, _ := os.ReadFile(logFile)
		t.Fatalf("%s: the controller never served its metrics: %v\ncontroller log:\n%s", version, err, tail(logs, 40))
	}
	before := webhookCalls(ctx, t, env)

	created := map[string]time.Time{}
	var wfs []*unstructured.Unstructured
	start := time.Now()
	for i := range p.workflows {
		wf := throughputWorkflow(i, notify)
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
				ph, _, _ := unstructured.NestedString(wf.Object, "status", "phase")
				if _, seen := runningAt[wf.GetName()]; !seen && (argo.Phase(ph) == argo.PhaseRunning || argo.Phase(ph).Terminal()) {
					runningAt[wf.GetName()] = now
				}
				if _, seen := doneAt[wf.GetName()]; !seen && argo.Phase(ph).Terminal() {
					doneAt[wf.GetName()] = now
					if argo.Phase(ph) != argo.PhaseSucceeded {
						msg, _, _ := unstructured.NestedString(wf.Object, "status", "message")
						t.Errorf("%s, %s, %s: workflow %s ended %s (%s): a throughput run must not fail a workflow", version, load, config, wf.GetName(), ph, msg)
					}
				}
			}
		}
		return len(doneAt) == len(wfs), nil
	})
	if err != nil {
		logs, _ := os.ReadFile(logFile)
		t.Fatalf("%s, %s, %s: %d of %d workflows completed within 10 minutes (%v)\ncontroller log:\n%s", version, load, config, len(doneAt), len(wfs), err, tail(logs, 40))
	}
	r := throughputRun{config: config, load: load}
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
	if mfs, err := scrapeController(ctx); err == nil {
		r.queueAdds, r.queueWait = workflowQueue(mfs)
	} else {
		t.Errorf("reading the controller's metrics: %v", err)
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

// workflowQueue reads the controller's workflow queue from its metrics: items added, and the
// mean time an item waited (argo_workflows_queue_adds_count and argo_workflows_queue_latency
// of queue workflow_queue, as v3.4 to v4.0 name them).
func workflowQueue(mfs map[string]*dto.MetricFamily) (adds float64, wait time.Duration) {
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
				h := m.GetHistogram()
				wait = time.Duration(h.GetSampleSum() / float64(h.GetSampleCount()) * float64(time.Second))
			}
		}
	}
	return adds, wait
}

// waitHTTP waits until url answers 200 (empty url: the controller's metrics endpoint answers).
func waitHTTP(ctx context.Context, url string) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		if url == "" {
			_, last = scrapeController(ctx)
		} else {
			_, last = getOK(ctx, url)
		}
		return last == nil, nil
	})
	if err != nil {
		return errors.Join(err, last)
	}
	return nil
}

// getOK GETs url and fails unless it answers 200.
func getOK(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), nil
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
