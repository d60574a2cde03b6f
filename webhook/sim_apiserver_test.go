//go:build envtest

package webhook

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// attemptPlan says which live-read attempts of the current decision fail.
type attemptPlan struct {
	mu     sync.Mutex
	plan   []bool
	called int
}

// fails says whether the next attempt fails.
func (p *attemptPlan) fails() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.called
	p.called++
	return k >= len(p.plan) || p.plan[k]
}

func (p *attemptPlan) set(plan []bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.plan, p.called = plan, 0
}

// planned is a client of the test API server whose live-read attempts fail as plan says: the
// List that begins each attempt (readWorkflow) fails, or reads through.
func planned(t *testing.T, plan *attemptPlan) client.Reader {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if plan.fails() {
				return apierrors.NewServiceUnavailable("simulated: the API server cannot answer")
			}
			return c.List(ctx, list, opts...)
		},
	})
}

// TestSimulationThroughTheAPIServer runs a sample of the simulation's histories end to end: the
// writes are made on the real API server, the guard (with its real watch) is called by the API
// server for each pod, and the oracle judges the answers. Time is compressed: every step runs
// as soon as the one before it is done, so the watch lags as little as it does.
func TestSimulationThroughTheAPIServer(t *testing.T) {
	const histories = 40
	for _, s := range []setting{simSettings[0], settingNamed(t, "--cover=exit-handlers")} {
		t.Run(s.name, func(t *testing.T) {
			plan := &attemptPlan{}
			opts := s.opts
			// No hedges (an attempt may take its whole budget), so that no attempt of one
			// pod's decision can start after the next pod's plan is set.
			opts.LiveReadTimeout, opts.LiveReadBudget, opts.HookStepReadBudget = 1500*time.Millisecond, 1500*time.Millisecond, 1500*time.Millisecond
			h := startGuard(t, opts, harnessOptions{reader: planned(t, plan)})
			var legit, stale, stopped, judged int
			for i := range histories {
				hist := generate(*simSeed + uint64(i))
				ns := newNamespace(t)
				objs := map[types.UID]*unstructured.Unstructured{}
				wi := 0
				for pi, p := range hist.pods {
					for ; wi < len(hist.writes) && hist.writes[wi].at <= p.at; wi++ {
						applyWrite(t, ns, objs, hist.writes[wi].state)
						// The store-first decisions of step pods read the store: let the
						// watch deliver first (the in-process simulation has the lag).
						st, wf := hist.writes[wi].state, objs[hist.writes[wi].state.uid]
						waitRecord(t, h.store, wf, "the write", func(r completionstore.Record) bool {
							return r.Deleted == st.deleted && (st.deleted || r.ResourceVersion == wf.GetResourceVersion())
						})
					}
					// At most three failed attempts before an answer (about 350 ms of
					// retries, well inside the budget), or none answering at all: so that
					// "the live read could answer" holds however slow this machine is.
					attempts := slices.Clone(hist.plans[pi])
					if slices.Contains(attempts, false) {
						for k := 3; k < len(attempts); k++ {
							attempts[k] = false
						}
					}
					plan.set(attempts)
					wf := objs[p.uid]
					pod := fixture.Pod(wf, fmt.Sprintf("pod-%d", pi), simName+"[0].main")
					switch p.kind {
					case roleExitHandler:
						pod = fixture.Pod(wf, fmt.Sprintf("pod-%d", pi), simName+".onExit[0].notify")
						pod.Labels[argo.LabelOnExit] = "true"
					case roleHook:
						pod = fixture.Pod(wf, fmt.Sprintf("pod-%d", pi), simName+".hooks.running")
					case roleAgent:
						pod = fixture.AgentPod(wf)
						pod.Name = fmt.Sprintf("pod-%d", pi)
					}
					var obj client.Object = pod
					if p.kind == roleTaskWrite {
						// The TaskSet created with a task (what a stale copy sends when the
						// workflow had no TaskSet, and is judged as a patch that adds one).
						key, tmpl := fixture.OnExitTask(wf)
						obj = fixture.TaskSet(wf, map[string]any{key: tmpl})
					}
					err := env.Client.Create(t.Context(), obj, client.DryRunAll)
					_, denied := contract.RefusalReason(err)
					if err != nil && !denied {
						t.Fatalf("seed %d pod %d: %v", hist.seed, pi, err)
					}
					state, _, _ := hist.truth(p.uid, p.at)
					due := state.deleted || oracleDenies(s.opts, state.phase)
					answered := slices.Contains(attempts, false)
					switch {
					case !p.stale:
						legit++
						if denied {
							t.Errorf("seed %d pod %d: a legitimate %s pod (workflow %s) was denied: %v", hist.seed, pi, p.kind, phaseName(state), err)
						}
					case oracleCovers(s.opts, p.kind) && due && answered:
						stale++
						judged++
						if !denied {
							t.Errorf("seed %d pod %d: a stale %s pod of a workflow %s was admitted although the live read could answer", hist.seed, pi, p.kind, phaseName(state))
						}
						stopped++
					default:
						stale++
					}
				}
			}
			t.Logf("%d histories through the API server: %d legitimate pods and TaskSet writes, %d stale ones, %d of them due and answerable, all refused: %v",
				histories, legit, stale, judged, judged == stopped)
			if legit == 0 || judged == 0 {
				t.Errorf("the sample made %d legitimate pods and %d stale pods to judge: nothing to check", legit, judged)
			}
		})
	}
}

// applyWrite makes one write of the truth on the API server, as Argo's controller (or argo
// retry, or the TTL controller) would.
func applyWrite(t *testing.T, ns string, objs map[types.UID]*unstructured.Unstructured, s wfState) {
	t.Helper()
	wf, ok := objs[s.uid]
	switch {
	case !ok:
		objs[s.uid] = createWorkflow(t, ns, simName, s.phase)
	case s.deleted:
		if err := env.Client.Delete(t.Context(), wf); err != nil {
			t.Fatal(err)
		}
	default:
		if !s.phase.Terminal() {
			// argo retry removes the completed label; setPhase writes it back as false.
			labels := wf.GetLabels()
			delete(labels, "workflows.argoproj.io/completed")
			wf.SetLabels(labels)
		}
		setPhase(t, wf, s.phase)
	}
}
