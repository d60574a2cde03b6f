//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// collector runs kube-controller-manager with its garbage collector alone, against the test
// API server: what deletes a WorkflowTaskSet (and agent pod) whose Workflow is gone.
type collector struct {
	bin, kubeconfig string
	log             *os.File

	mu   sync.Mutex
	proc *testenv.Process
}

func newCollector(t *testing.T, env *testenv.Env, logDir string) *collector {
	t.Helper()
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(assets, "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no kube-controller-manager at %s: run 'make e2e-argo' (hack/envtest-binaries.sh ensure-gc builds it from Go modules)", bin)
	}
	kc := filepath.Join(t.TempDir(), "kube-controller-manager.kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(logDir, fmt.Sprintf("kube-controller-manager-%d.log", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = log.Close() })
	return &collector{bin: bin, kubeconfig: kc, log: log}
}

// start starts the garbage collector; it is a no-op while it runs.
func (g *collector) start(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.proc != nil {
		return
	}
	proc, err := testenv.Launch(g.bin, []string{"--kubeconfig=" + g.kubeconfig, "--controllers=garbagecollector",
		"--leader-elect=false", "--secure-port=0", "--v=2"}, nil, g.log)
	if err != nil {
		t.Fatal(err)
	}
	g.proc = proc
}

// stop stops the garbage collector, if it runs.
func (g *collector) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.proc == nil {
		return
	}
	_ = g.proc.Stop(10 * time.Second)
	g.proc = nil
}

// reuse is what became of one workflow that reused a deleted workflow's name.
type reuse struct {
	name string
	// gcLate: the garbage collector was stopped when the old workflow was deleted and started
	// only gcDelay after the new one was created.
	gcLate bool
	phase  argo.Phase
	// ownCall: the new workflow's HTTP step made its own call (not the old one's result taken
	// from the old TaskSet's status).
	ownCall bool
	// Times from the new workflow's creation: the old TaskSet gone; the new workflow's own
	// call made; the new workflow complete.
	taskSetGone, called, done time.Duration
	// ownerGone: the guard's TaskSetOwnerGone Events (row T5) about the name; holderWrote:
	// the TaskSet updates it admitted as the new workflow's own (row T6).
	ownerGone   int
	holderWrote float64
	stepMessage string
}

// gcDelay is how long the garbage collector is kept away in the runs that model a slow one.
const gcDelay = 20 * time.Second

// reuseDrive runs n pairs: an HTTP workflow (an HTTP step beside its pod steps) named
// reuse-<i> runs to Succeeded and is deleted; at once a workflow of the same shape and name is
// created. Odd pairs keep the garbage collector away for gcDelay.
func reuseDrive(n int, out *[]reuse) func(ctx context.Context, t *testing.T, r rig) []*unstructured.Unstructured {
	return func(ctx context.Context, t *testing.T, r rig) []*unstructured.Unstructured {
		t.Helper()
		var wfs []*unstructured.Unstructured
		for i := range n {
			name := fmt.Sprintf("reuse-%d", i)
			late := i%2 == 1
			old := httpWorkflow(false, r.notify.url(), true, r.notify.pingURL())
			old.SetGenerateName("")
			old.SetName(name)
			if err := r.c.Create(ctx, old); err != nil {
				t.Fatal(err)
			}
			waitPhase(ctx, t, r.c, old, 2*time.Minute)
			ts := &unstructured.Unstructured{}
			ts.SetGroupVersionKind(argo.GroupVersion.WithKind(argo.TaskSetKind))
			if err := r.c.Get(ctx, client.ObjectKeyFromObject(old), ts); err != nil {
				t.Fatalf("the old workflow's TaskSet: %v", err)
			}
			if late {
				r.gc.stop()
			}
			if err := r.c.Delete(ctx, old, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
				t.Fatal(err)
			}
			if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				err := r.c.Get(ctx, client.ObjectKeyFromObject(old), &unstructured.Unstructured{Object: map[string]any{"apiVersion": old.GetAPIVersion(), "kind": old.GetKind()}})
				return apierrors.IsNotFound(err), nil
			}); err != nil {
				t.Fatalf("the old workflow %s was not deleted: %v", name, err)
			}
			ping := "/ping/" + name
			pingsBefore := r.notify.count(ping)
			holderWrote := func() float64 {
				if r.g == nil {
					return 0
				}
				mfs, err := r.g.Metrics(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return testenv.SumSeries(mfs, "exit_guard_decisions_total", map[string]string{"reason": string(contract.ReasonTasksOfNameHolder)})
			}
			before := holderWrote()
			nw := httpWorkflow(false, r.notify.url(), true, r.notify.pingURL())
			nw.SetGenerateName("")
			nw.SetName(name)
			created := time.Now()
			if err := r.c.Create(ctx, nw); err != nil {
				t.Fatal(err)
			}
			gone := make(chan time.Duration, 1)
			go func() {
				// When the old TaskSet leaves the API server.
				err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
					cur := &unstructured.Unstructured{}
					cur.SetGroupVersionKind(argo.GroupVersion.WithKind(argo.TaskSetKind))
					err := r.c.Get(ctx, client.ObjectKeyFromObject(ts), cur)
					return apierrors.IsNotFound(err) || (err == nil && cur.GetUID() != ts.GetUID()), nil
				})
				if err != nil {
					gone <- -1
					return
				}
				gone <- time.Since(created)
			}()
			if late {
				select {
				case <-ctx.Done():
				case <-time.After(gcDelay):
				}
				r.gc.start(t)
			}
			res := reuse{name: name, gcLate: late}
			res.phase = waitPhase(ctx, t, r.c, nw, 5*time.Minute)
			res.done = time.Since(created)
			res.taskSetGone = <-gone
			if r.notify.count(ping) > pingsBefore {
				res.ownCall, res.called = true, r.notify.lastCall(ping).Sub(created)
			}
			res.ownerGone = ownerGoneEvents(ctx, t, r.c, name)
			res.holderWrote = holderWrote() - before
			res.stepMessage = nodeMessage(ctx, r.c, nw, ".ping")
			*out = append(*out, res)
			wfs = append(wfs, nw)
		}
		return wfs
	}
}

// waitPhase waits until wf is complete and returns its phase.
func waitPhase(ctx context.Context, t *testing.T, c client.Client, wf *unstructured.Unstructured, limit time.Duration) argo.Phase {
	t.Helper()
	var p argo.Phase
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		p = phase(ctx, c, wf)
		return p.Terminal(), nil
	}); err != nil {
		t.Fatalf("%s not complete within %v (phase %q)", wf.GetName(), limit, p)
	}
	return p
}

// ownerGoneEvents counts the guard's TaskSetOwnerGone Events about the workflow name.
func ownerGoneEvents(ctx context.Context, t *testing.T, c client.Client, name string) int {
	t.Helper()
	return testenv.CountEvents(ctx, t, c, testenv.EventsAbout{Namespace: namespace, Name: name, Reason: contract.EventReasonTaskSetOwnerGone})
}

// nodeMessage is the phase and message of wf's node whose name ends with suffix.
func nodeMessage(ctx context.Context, c client.Client, wf *unstructured.Unstructured, suffix string) string {
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(argo.WorkflowGVK)
	if err := c.Get(ctx, types.NamespacedName{Namespace: wf.GetNamespace(), Name: wf.GetName()}, cur); err != nil {
		return err.Error()
	}
	nodes, _, _ := unstructured.NestedMap(cur.Object, "status", "nodes")
	var found []string
	for _, v := range nodes {
		n, _ := v.(map[string]any)
		if name, _ := n["displayName"].(string); strings.HasSuffix("."+name, suffix) {
			msg, _ := n["message"].(string)
			found = append(found, fmt.Sprintf("%v %q", n["phase"], msg))
		}
	}
	slices.Sort(found)
	return strings.Join(found, ", ")
}

func (m guardMode) String() string {
	switch m {
	case noGuard:
		return "off"
	case guardDirect:
		return "on"
	case guardLagging:
		return "on (lagging watch)"
	case guardNoEventRule:
		return "on (no Event rule)"
	}
	return fmt.Sprint(int(m))
}

// A workflow that reuses the name of a deleted HTTP workflow meets the old WorkflowTaskSet
// until the garbage collector deletes it: Argo's create fails with AlreadyExists and it
// merge-patches the old TaskSet, which keeps the old owner. The guard admits the patch as the
// new workflow's own (row T6) from the create it admitted just before, or, on a later pass,
// from the task's pending node in the new workflow's status. Nothing wakes the workflow when
// the old TaskSet is deleted (Argo's TaskSet informer acts on updates only), so a refusal of
// every pass would leave the HTTP step waiting for the workflow's resync, 20 minutes. This
// measures, on v3.4.17 with the real garbage collector, how long the new workflow's HTTP step
// waits, with and without the guard, with the collector at work and with it kept away for
// gcDelay, at the controller's requeue time of the other runs (1 s) and its default (10 s).
func TestReusedNameWaitsForTheGarbageCollector(t *testing.T) {
	n := 2 * tries(t)
	type run struct {
		mode guardMode
		// requeue is the controller's DEFAULT_REQUEUE_TIME: how soon a workflow that asked
		// to be reconciled again is (the runs' 1 s, and Argo's default, 10 s).
		requeue string
	}
	runs := []run{{noGuard, "1s"}, {guardDirect, "1s"}, {noGuard, "10s"}, {guardDirect, "10s"}}
	results := map[run][]reuse{}
	for _, r := range runs {
		var got []reuse
		runScenario(t, scenario{version: "v3.4.17", mode: r.mode, http: true, direct: true, gc: true, drive: reuseDrive(n, &got),
			env: []string{"DEFAULT_REQUEUE_TIME=" + r.requeue}})
		results[r] = got
		for _, w := range got {
			t.Logf("guard %v, requeue %s, %s (GC late %v): %s after %v; old TaskSet gone after %v; own call %v after %v; TaskSetOwnerGone Events %d, updates admitted as the new workflow's %v; HTTP step: %s",
				r.mode, r.requeue, w.name, w.gcLate, w.phase, w.done.Round(time.Millisecond), w.taskSetGone.Round(time.Millisecond), w.ownCall, w.called.Round(time.Millisecond), w.ownerGone, w.holderWrote, w.stepMessage)
		}
	}
	for _, run := range runs {
		mode := run.mode
		for _, late := range []bool{false, true} {
			var done, called []time.Duration
			calls, ownerGone, ok := 0, 0, 0
			holderWrote := 0.0
			for _, r := range results[run] {
				if r.gcLate != late {
					continue
				}
				done = append(done, r.done)
				if r.ownCall {
					calls++
					called = append(called, r.called)
				}
				if r.phase == argo.PhaseSucceeded {
					ok++
				}
				ownerGone += r.ownerGone
				holderWrote += r.holderWrote
			}
			t.Logf("RESULT name reuse, guard %v, requeue %s, GC late %v: %d workflows, %d Succeeded, %d made their own HTTP call (after %v), complete after %v; TaskSetOwnerGone Events %d, updates admitted as the new workflow's %v",
				mode, run.requeue, late, len(done), ok, calls, called, done, ownerGone, holderWrote)
		}
	}
	for _, r := range slices.Concat(results[runs[1]], results[runs[3]]) {
		if r.phase != argo.PhaseSucceeded || !r.ownCall {
			t.Errorf("with the guard, %s ended %s, its HTTP step made its own call: %v", r.name, r.phase, r.ownCall)
		}
		if r.gcLate && r.holderWrote == 0 {
			t.Errorf("with the guard, %s met the old TaskSet for %v and no update was admitted as its own (row T6): the case was not made", r.name, gcDelay)
		}
	}
}
