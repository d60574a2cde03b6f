//go:build e2e

package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

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

// throughputConfigs are the configurations compared: no webhook; the do-nothing webhook, which
// admits every review at once, registered and served as the guard is (the chart's webhooks, the
// same TLS and server): the floor under any webhook; the guard as the chart installs it (default
// and --store-first, row T7 off); and the live-GET peer (pods only).
var throughputConfigs = []string{noWebhook, doNothing, "exit-guard", "exit-guard --store-first", "exit-guard --taskset-repeats-for=-1s", "live-GET peer"}

const (
	noWebhook = "no webhook"
	doNothing = "do-nothing webhook"
)

// throughputMixes are the workflows a batch can be made of (throughputWorkflow).
var throughputMixes = []string{"pods", "http", "mixed"}

// throughputParams are the run's sizes, from the environment (make e2e-throughput).
type throughputParams struct {
	versions    []string
	workflows   int
	parallelism int
	rounds      int
	loads       []string
	mixes       []string
	configs     []string
	report      string
}

func throughputFromEnv(t *testing.T) throughputParams {
	t.Helper()
	p := throughputParams{versions: []string{"v3.4.17"}, workflows: 8, parallelism: 4, rounds: 1, loads: []string{"idle"},
		mixes: []string{"mixed"}, configs: []string{noWebhook, "exit-guard"}, report: os.Getenv("E2E_THROUGHPUT_REPORT")}
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
	list("E2E_THROUGHPUT_MIXES", &p.mixes, throughputMixes)
	list("E2E_THROUGHPUT_CONFIGS", &p.configs, nil)
	for _, c := range p.configs {
		// Beside the named configurations, the guard with any flags ("exit-guard --flag=value").
		if !slices.Contains(throughputConfigs, c) && !strings.HasPrefix(c, "exit-guard --") {
			t.Fatalf("E2E_THROUGHPUT_CONFIGS: %q is not one of %q, nor exit-guard with flags", c, throughputConfigs)
		}
	}
	if !slices.Contains(p.configs, noWebhook) {
		t.Fatal("E2E_THROUGHPUT_CONFIGS must include \"no webhook\": every ratio is to it")
	}
	return p
}

// throughputRun is what one batch measured.
type throughputRun struct {
	config, load, mix string
	round             int
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
	queueAdds   float64
	queueWait   time.Duration
	queueSpread string
	// operations: the controller's passes over a workflow, their mean time and spread.
	operations      float64
	operationMean   time.Duration
	operationSpread string
	// served: the CPU time (user and system) the webhook's process used over the batch.
	served time.Duration
	// decisions: what the guard decided, from its metrics (guardDecisions).
	decisions string
	// reads: the GETs and LISTs of Workflows the API server served over the batch (the
	// guard's live reads among them), by verb.
	reads map[string]hookCalls
}

func TestArgoThroughput(t *testing.T) {
	p := throughputFromEnv(t)
	runs.Add(1)
	loadBin := ""
	if slices.Contains(p.configs, "live-GET peer") || slices.Contains(p.configs, doNothing) {
		loadBin = filepath.Join(t.TempDir(), "load")
		cmd := exec.Command("go", "build", "-o", loadBin, "./test/load") //nolint:gosec // G204: this repository's own tool
		cmd.Dir = testenv.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the live-GET peer and the do-nothing webhook (test/load): %v\n%s", err, out)
		}
	}
	var report strings.Builder
	for _, version := range p.versions {
		var all []throughputRun
		for round := range p.rounds {
			for _, load := range p.loads {
				for _, mix := range p.mixes {
					order := slices.Clone(p.configs)
					rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] }) //nolint:gosec // G404: an order of runs, not a secret
					for _, config := range order {
						r := runThroughput(t, version, config, load, mix, p, loadBin)
						r.round = round
						all = append(all, r)
						var hooks []string
						for name, h := range r.byHook {
							hooks = append(hooks, fmt.Sprintf("%s %.0f in %s", name, h.count, time.Duration(h.seconds*float64(time.Second)).Round(time.Millisecond)))
						}
						slices.Sort(hooks)
						t.Logf("%s, %s, %s mix, %s, round %d: %.2f workflows/min, create to done p50 %s p99 %s; webhook calls %.0f (mean %s; %s), served in %s of CPU; controller queue adds %.0f, mean wait %s (%s); passes %.0f, mean %s (%s); the guard's decisions: %s; workflow reads at the API server: %s",
							version, load, mix, config, round+1, r.perMinute, q(r.done, 0.5), q(r.done, 0.99), r.calls, r.callMean.Round(10*time.Microsecond), strings.Join(hooks, ", "),
							r.served, r.queueAdds, r.queueWait.Round(10*time.Microsecond), r.queueSpread, r.operations, r.operationMean.Round(10*time.Microsecond), r.operationSpread, r.decisions, readsOf(r))
					}
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

// throughputWorkflow is the i-th workflow of mix. Each exit handler and hook runs (no `when`, an
// expression true while the workflow runs): its pod or its TaskSet write is what the guard
// judges.
//   - mixed: steps with a pod exit handler; a DAG; a step that fails once and is retried; HTTP
//     steps with an HTTP exit handler (Argo's agent).
//   - pods: every pod role the guard judges: steps with a pod exit handler; a DAG whose last
//     task has an exit handler of its own (<task>.onExit); a step retried once; steps with a
//     workflow-level hook and a step-level hook, both `running` (<wf>.hooks.running,
//     <step>.hooks.running), and a pod exit handler.
//   - http: HTTP steps with an HTTP exit handler, every workflow.
func throughputWorkflow(i int, mix string, notify *notifier) *unstructured.Unstructured {
	container := func(name string) map[string]any {
		return map[string]any{"name": name, "container": map[string]any{"image": "busybox", "command": []any{"sh", "-c", "echo " + name}}}
	}
	httpTemplate := func(name, url string) map[string]any {
		return map[string]any{"name": name, "http": map[string]any{"url": url, "method": "POST",
			"body": "workflow {{workflow.name}} is {{workflow.status}}", "successCondition": "response.statusCode == 200"}}
	}
	step := func(name, template string) map[string]any { return map[string]any{"name": name, "template": template} }
	const onExit = "exit-handler"
	exitHandler := map[string]any{"name": onExit, "steps": []any{[]any{step("notify", "notify")}}}
	spec := map[string]any{"entrypoint": "main", "onExit": onExit, "podGC": map[string]any{"strategy": "OnPodCompletion"}}
	shape := "http"
	switch mix {
	case "mixed":
		shape = []string{"steps", "dag", "retry", "http"}[i%4]
	case "pods":
		shape = []string{"steps", "dag-exit", "retry", "hooks"}[i%4]
	}
	var templates []any
	switch shape {
	case "steps":
		templates = []any{
			map[string]any{"name": "main", "steps": []any{[]any{step("s1", "work")}, []any{step("s2", "work"), step("s3", "work")}}},
			container("work"), container("notify"), exitHandler,
		}
	case "dag", "dag-exit":
		last := map[string]any{"name": "d4", "template": "work", "dependencies": []any{"d2", "d3"}}
		if shape == "dag-exit" {
			last["onExit"] = "notify"
		}
		templates = []any{
			map[string]any{"name": "main", "dag": map[string]any{"tasks": []any{
				step("d1", "work"),
				map[string]any{"name": "d2", "template": "work", "dependencies": []any{"d1"}},
				map[string]any{"name": "d3", "template": "work", "dependencies": []any{"d1"}},
				last,
			}}},
			container("work"), container("notify"), exitHandler,
		}
	case "retry":
		flaky := container("flaky")
		flaky["retryStrategy"] = map[string]any{"limit": "2"}
		templates = []any{
			map[string]any{"name": "main", "steps": []any{[]any{step("s1", "work")}, []any{step("flaky", "flaky")}}},
			container("work"), flaky, container("notify"), exitHandler,
		}
	case "hooks":
		spec["hooks"] = map[string]any{"running": map[string]any{"expression": `workflow.status == "Running"`, "template": "notify"}}
		s1 := step("s1", "work")
		s1["hooks"] = map[string]any{"running": map[string]any{"expression": `steps["s1"].status == "Running"`, "template": "notify"}}
		templates = []any{
			map[string]any{"name": "main", "steps": []any{[]any{s1}, []any{step("s2", "work")}}},
			container("work"), container("notify"), exitHandler,
		}
	default:
		templates = []any{
			map[string]any{"name": "main", "steps": []any{[]any{step("s1", "work"), step("ping", "ping")}, []any{step("ping2", "ping")}}},
			container("work"), httpTemplate("ping", notify.pingURL()), httpTemplate("notify", notify.url()), exitHandler,
		}
	}
	spec["templates"] = templates
	wf := &unstructured.Unstructured{}
	wf.SetGroupVersionKind(argo.WorkflowGVK)
	wf.SetNamespace(namespace)
	wf.SetGenerateName("tp-" + shape + "-")
	wf.Object["spec"] = spec
	return wf
}

// readsOf says r.reads: each verb's count and mean.
func readsOf(r throughputRun) string {
	var parts []string
	for _, verb := range []string{"GET", "LIST"} {
		h := r.reads[verb]
		mean := time.Duration(0)
		if h.count > 0 {
			mean = time.Duration(h.seconds / h.count * float64(time.Second))
		}
		parts = append(parts, fmt.Sprintf("%s %.0f (mean %s)", verb, h.count, mean.Round(10*time.Microsecond)))
	}
	return strings.Join(parts, ", ")
}
