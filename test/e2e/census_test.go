//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// afterCompletion is how long after a workflow's finishedAt (whole seconds) the census starts
// counting its writes: the pass that completed it has written by then; a stale copy comes back
// with the controller's lagging watch (watchLag) later.
const afterCompletion = 2 * time.Second

// census is what Argo's controller wrote about the workflows of a run after each completed, as
// the API server's audit log has it (testenv.AuditWrites of testenv.ControllerUser): by verb,
// resource, subresource and answer ("create pods 201"), over every workflow of the run.
type census struct {
	auditLog  string
	workflows int
	rows      map[string]int
	// all are every write of the controller about the workflows, in the whole run: that the
	// PVCs, the PodDisruptionBudget and the cache were written at all.
	all map[string]int
	// pods are the pods created after completion (2xx), by name; podsBy the same by the user
	// that created them (the controller, or a second one: testenv.SecondControllerUser).
	pods   []string
	podsBy map[string][]string
	// from, when set, is the earliest write counted (a restart of the controller).
	from time.Time
}

// about says whether the object name of namespace ns is one of workflow wf's, in the test's
// namespace: the workflow, its TaskSet and PodDisruptionBudget (its name), its pods and PVCs
// (<wf>-...), its Events (<wf>.<suffix>), and the memoization cache the census workflows share
// (censusMemo).
func about(wf, ns, name string) bool {
	return ns == namespace && (name == wf || strings.HasPrefix(name, wf+"-") || strings.HasPrefix(name, wf+".") || name == censusMemo)
}

// secondRow begins the census rows of a second controller's writes (testenv.SecondControllerUser).
const secondRow = "second controller: "

// count reads the audit log and counts, for each of wfs, the controller's writes about it
// received more than afterCompletion after its finishedAt.
func (cs *census) count(ctx context.Context, t *testing.T, c client.Client, wfs []*unstructured.Unstructured) {
	t.Helper()
	writes, err := testenv.ReadWrites(cs.auditLog)
	if err != nil {
		t.Fatalf("reading the API server's audit log: %v", err)
	}
	cs.rows, cs.all, cs.pods, cs.podsBy, cs.workflows = map[string]int{}, map[string]int{}, nil, map[string][]string{}, 0
	for _, wf := range wfs {
		done := finishedAt(ctx, c, wf)
		if done.IsZero() {
			t.Errorf("%s has no finishedAt: the census cannot tell its stale pass", wf.GetName())
			continue
		}
		cs.workflows++
		for _, w := range writes {
			if w.User != testenv.ControllerUser && w.User != testenv.SecondControllerUser || !about(wf.GetName(), w.Namespace, w.Name) {
				continue
			}
			row := w.String()
			if w.User == testenv.SecondControllerUser {
				row = secondRow + row
			}
			cs.all[row]++
			if w.At.After(done.Add(afterCompletion)) && w.At.After(cs.from) {
				cs.rows[row]++
				if w.Verb == "create" && w.Resource == "pods" && w.Code/100 == 2 {
					cs.pods = append(cs.pods, w.Name)
					cs.podsBy[w.User] = append(cs.podsBy[w.User], w.Name)
				}
			}
		}
	}
}

// String lists the rows, most frequent first: "create pods 429: 6; update workflows 409: 3".
func (cs *census) String() string { return rowsText(cs.rows) }

// rowsText lists rows, most frequent first.
func rowsText(rows map[string]int) string {
	if len(rows) == 0 {
		return "none"
	}
	keys := slices.SortedFunc(maps.Keys(rows), func(a, b string) int {
		if d := rows[b] - rows[a]; d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %d", k, rows[k]))
	}
	return strings.Join(parts, "; ")
}

// TestCensusOfAStalePassesWrites lists every write Argo's controller makes about a workflow
// after it completed, from the API server's own audit log: with no stale copy (the controller
// watches the API server directly), with the stale copies of the lagging watch and no guard,
// and with the guard. The reference workflows (two parallel step pods, pod GC on completion,
// an exit handler that notifies unless Succeeded) with a second step group, a volume claim
// template, a PodDisruptionBudget and a memoized step (withCensusFeatures), and again with a
// failure hook (censusHooks: the workflow-level one by default). It fails when, with the guard,
// any pod a stale copy sends (its exit handler, its hook, a step run again) is created after its
// workflow completed: what the guard claims to stop must not reach etcd.
func TestCensusOfAStalePassesWrites(t *testing.T) {
	// The lines without upstream's fix (#16357: v3.7.16+, v4.0.7+, v4.1.0+), with the
	// informer's write-back on (the default before 4.0; INFORMER_WRITE_BACK on 4.0).
	for _, line := range []struct {
		version string
		env     []string
	}{{"v3.4.17", nil}, {"v3.6.18", nil}, {"v4.0.5", []string{"INFORMER_WRITE_BACK=true"}}} {
		for _, hook := range censusHooks(t) {
			version := line.version
			name := version
			if hook != noHook {
				name += ", a " + hook + " hook"
			}
			t.Run(name, func(t *testing.T) {
				var control, stale, guarded census
				runScenario(t, scenario{version: version, mode: noGuard, ok: 3, direct: true, env: line.env, hook: hook, census: &control})
				staleOut := runScenario(t, scenario{version: version, mode: noGuard, ok: 3, env: line.env, hook: hook, census: &stale})
				guardedOut := runScenario(t, scenario{version: version, mode: guardDirect, ok: 3, env: line.env, hook: hook, census: &guarded})
				for _, r := range []struct {
					name string
					cs   *census
				}{{"no stale copy (direct watch), no guard", &control}, {"stale copies, no guard", &stale}, {"stale copies, the guard", &guarded}} {
					t.Logf("CENSUS %s, %s: %d workflows; the controller's writes about them after completion: %s", name, r.name, r.cs.workflows, r.cs)
					t.Logf("  in the whole run: %s", rowsText(r.cs.all))
					t.Logf("  pods created after completion: %q", r.cs.pods)
				}
				var falseNotices int
				for _, o := range staleOut {
					falseNotices += o.notifyPods - o.realNotices
				}
				if falseNotices == 0 {
					t.Fatalf("no stale copy sent its exit handler (or failure hook) without the guard on %s: the census proves nothing", name)
				}
				for _, o := range guardedOut {
					if late := o.notifyPods - o.realNotices; late != 0 {
						t.Errorf("%s: %d notification pods (exit handler, failure hook) created after the workflow completed, with the guard", o.name, late)
					}
				}
				// Every pod a stale pass sends is covered by default (exit handlers, agents, steps):
				// none may be created after its workflow completed.
				if len(guarded.pods) > 0 {
					t.Errorf("with the guard, pods created after their workflow completed on %s: %q", name, guarded.pods)
				}
			})
		}
	}
}

// censusHooks are the failure-hook shapes the census runs the reference workflows with, beside
// the exit handler: E2E_CENSUS_HOOKS (comma-separated: none, workflow-level, step-level, DAG task), by default
// none and the workflow-level hook, the first and only pod a stale pass sends.
func censusHooks(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, h := range strings.Split(cmp.Or(os.Getenv("E2E_CENSUS_HOOKS"), "none,"+hookWorkflow), ",") {
		switch h {
		case "none":
			out = append(out, noHook)
		case hookWorkflow, hookStep, hookDAG:
			out = append(out, h)
		default:
			t.Fatalf("E2E_CENSUS_HOOKS: %q is not a hook shape (none, %s, %s, %s)", h, hookWorkflow, hookStep, hookDAG)
		}
	}
	return out
}
