//go:build envtest

package webhook

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

var (
	waitsPerRole = flag.Int("waits.n", 4, "pod creates per role and workflow in TestEachRoleWaitsWithinItsBudgetWhileReadsHang (make waits sets more)")
	waitsReport  = flag.String("waits.report", "", "write the waits' figures as a Markdown table to this file")
)

// TestEachRoleWaitsWithinItsBudgetWhileReadsHang: the guard's watch is stale (it has not
// advanced for longer than WatchStaleAfter, the store's clock says) and every live read hangs,
// as on an API server too loaded to answer the guard. Pods of every role, of a running workflow
// and of one the store saw succeed, are created through the real API server (dry-run, four at a
// time, as Argo's workers send them), which calls the guard's webhook. Each is decided as the
// table says once no read answers: the running workflow's admitted, the completed one's refused
// from the store where --store-fallback=requeue lets it (exit-handler, hook and step pods) and
// admitted as unconfirmed-completion where it does not (the agent). The test asserts the
// decisions, and that the reads were made and held; how long each create took is the figure it
// reports (docs/evidence/reliability.md, "What a pod waits"), never a timed assertion.
func TestEachRoleWaitsWithinItsBudgetWhileReadsHang(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var hanging atomic.Bool
	var heldReads atomic.Int64
	hang := func(ctx context.Context) error {
		if !hanging.Load() {
			return nil
		}
		heldReads.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}
	h := startGuard(t, Options{}, harnessOptions{storeClock: clk, reader: faultyReader(t, hang, hang)})
	ns := newNamespace(t)
	running := createWorkflow(t, ns, "running", argo.PhaseRunning)
	done := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	waitStore(t, h.store, done, argo.PhaseSucceeded)
	waitStore(t, h.store, running, argo.PhaseRunning)
	// The watch has not advanced for longer than WatchStaleAfter: step pods read live too.
	clk.Step(4 * time.Minute)
	if h.store.WatchFresh() {
		t.Fatal("the store's watch is still fresh after its clock moved past WatchStaleAfter")
	}
	hanging.Store(true)
	t.Cleanup(func() { hanging.Store(false) })

	roles := []struct {
		name string
		role role
		pod  func(wf *unstructured.Unstructured, i int) *corev1.Pod
		// refusedWhenDone: the store alone refuses it for the completed workflow.
		refusedWhenDone bool
	}{
		{"step", roleStep, func(wf *unstructured.Unstructured, i int) *corev1.Pod {
			return fixture.Pod(wf, fmt.Sprintf("%s-main-%d", wf.GetName(), i), fmt.Sprintf("%s[%d].work", wf.GetName(), i))
		}, true},
		{"lifecycle hook", roleHook, func(wf *unstructured.Unstructured, i int) *corev1.Pod {
			return fixture.Pod(wf, fmt.Sprintf("%s-hook-%d", wf.GetName(), i), wf.GetName()+".hooks.failed")
		}, true},
		{"exit handler", roleExitHandler, func(wf *unstructured.Unstructured, _ int) *corev1.Pod { return fixture.ExitPod(wf) }, true},
		{"agent", roleAgent, func(wf *unstructured.Unstructured, _ int) *corev1.Pod { return fixture.AgentPod(wf) }, false},
	}
	n := *waitsPerRole
	type figure struct {
		role, workflow string
		waits          []time.Duration
	}
	var figures []figure
	for _, r := range roles {
		for _, wf := range []*unstructured.Unstructured{running, done} {
			before := heldReads.Load()
			timedBefore := h.counter(t, "exit_guard_decision_duration_seconds", map[string]string{"role": string(r.role)})
			refuse := wf == done && r.refusedWhenDone
			waits := make([]time.Duration, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 4) // Argo's workers send one request at a time each
			for i := range n {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					start := time.Now()
					errs[i] = env.Client.Create(t.Context(), r.pod(wf, i), client.DryRunAll)
					waits[i] = time.Since(start)
				}()
			}
			wg.Wait()
			for i, err := range errs {
				reason, _ := contract.RefusalReason(err)
				switch {
				case refuse && reason != contract.ReasonWorkflowCompleted:
					t.Errorf("%s pod %d of %s: err = %v, want refused for %s from the store", r.name, i, wf.GetName(), err, contract.ReasonWorkflowCompleted)
				case !refuse && err != nil:
					t.Errorf("%s pod %d of %s: err = %v, want admitted", r.name, i, wf.GetName(), err)
				}
			}
			// Each decision read live and the read was held: every attempt of a batch ends
			// with its decision's budget, so none of an earlier batch counts here.
			if held := heldReads.Load() - before; held < int64(n) {
				t.Errorf("%s pods of %s: %d live reads held for %d decisions: they did not read live", r.name, wf.GetName(), held, n)
			}
			// The guard's own timing of each decision, by its role: what an operator reads.
			if timed := h.counter(t, "exit_guard_decision_duration_seconds", map[string]string{"role": string(r.role)}) - timedBefore; timed != float64(n) {
				t.Errorf("%s pods of %s: exit_guard_decision_duration_seconds{role=%q} counted %v decisions, want %d", r.name, wf.GetName(), r.role, timed, n)
			}
			figures = append(figures, figure{r.name, map[bool]string{true: "Succeeded", false: "Running"}[wf == done], waits})
		}
	}
	if h.store.WatchFresh() {
		t.Error("the store's watch became fresh during the run: step pods may have been decided without a read")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| role | workflow | creates | p50 | p99 | max |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, f := range figures {
		slices.Sort(f.waits)
		q := func(p float64) time.Duration { return f.waits[min(len(f.waits)-1, int(p*float64(len(f.waits))))] }
		fmt.Fprintf(&b, "| %s | %s | %d | %v | %v | %v |\n", f.role, f.workflow, len(f.waits),
			q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond), f.waits[len(f.waits)-1].Round(time.Millisecond))
	}
	t.Logf("pod creates with the guard's watch stale and every live read hanging:\n%s", b.String())
	if *waitsReport != "" {
		doc := "# What a pod waits on the guard when the API server hangs\n\n" +
			"Written by `make waits` (`go test -tags envtest ./webhook -run TestEachRoleWaitsWithinItsBudgetWhileReadsHang -args -waits.n=N -waits.report=FILE`); " +
			"docs/decisions.md, \"What a pod costs\", says what bounds each role. Measured on commit " + commitOf() + ".\n\n" +
			"The guard's watch stale (not advanced past WatchStaleAfter, so step pods read live too) and every live read hanging; " +
			"the guard's defaults (`--hook-step-read-budget=750ms`, `--live-read-budget=4s`, `--store-fallback=requeue`). " +
			"Each create is a dry-run pod create through the real kube-apiserver, which calls the webhook (timeoutSeconds 5), " +
			"four in flight at a time as Argo's workers send them, timed by the client: the API server's own handling included. " +
			"Running: admitted from the store; Succeeded: refused from the store (the agent: admitted as unconfirmed-completion).\n\n" + b.String()
		if err := os.WriteFile(*waitsReport, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// commitOf is the checkout's commit, for the report; "unknown" outside a git checkout.
func commitOf() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
