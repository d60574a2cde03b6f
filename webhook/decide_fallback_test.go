package webhook

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// TestFreshFallbackCountsFromTheWatchsLastAdvance: with --store-fallback=fresh, a completion
// only the store holds refuses an exit handler while the newest write the store is known to
// hold (its latest lag sample, plus the time since) was written less than --store-fresh-for
// ago; it admits (unconfirmed-completion) with no sample, once that write is older, or when
// the sample itself says the store is further behind. A bookmark moves the watch's progress
// but says nothing of time.
func TestFreshFallbackCountsFromTheWatchsLastAdvance(t *testing.T) {
	store, clk := fakeClockStore(t)
	wf := tableWorkflow
	g, err := newGuard(nil, store, Options{StoreFallback: FallbackFresh, StoreFreshFor: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	g.readLive = cannedRead(liveTimesOut, &calls)
	exit := podFacts(t, fixture.ExitPod(wf))
	decideNow := func() decision { return g.decide(t.Context(), exit) }
	store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: wf.GetNamespace(), Name: wf.GetName(), ResourceVersion: "5", Phase: argo.PhaseSucceeded})
	for _, step := range []struct {
		what     string
		progress string
		lag      time.Duration // a lag sample, when not 0
		wait     time.Duration
		deny     bool
	}{
		{what: "no lag sample ever", progress: "5", wait: time.Second, deny: false},
		{what: "a write 1 s old on arrival, 28 s ago", progress: "6", lag: time.Second, wait: 28 * time.Second, deny: true},
		{what: "that write now 30 s old", wait: time.Second, deny: false},
		{what: "a bookmark: progress, no newer write", progress: "7", deny: false},
		{what: "a write 2 s old on arrival", progress: "8", lag: 2 * time.Second, deny: true},
		{what: "a write 31 s old on arrival: the store that far behind", progress: "9", lag: 31 * time.Second, deny: false},
		{what: "a write at once, 10 s ago", progress: "10", lag: time.Millisecond, wait: 10 * time.Second, deny: true},
		{what: "21 s later, no newer write", progress: "10", wait: 21 * time.Second, deny: false},
	} {
		if step.progress != "" {
			store.Progress(step.progress)
		}
		if step.lag > 0 {
			store.NoteLag(step.lag)
		}
		clk.Step(step.wait)
		d := decideNow()
		want := contract.ReasonUnconfirmedCompletion
		if step.deny {
			want = contract.ReasonWorkflowCompleted
		}
		if d.deny != step.deny || d.reason != want || d.source != sourceStore || d.row != "11" {
			t.Errorf("%s: deny %v reason %s source %s row %s, want deny %v reason %s from the store, row 11", step.what, d.deny, d.reason, d.source, d.row, step.deny, want)
		}
	}
}

// TestRequeueFallbackRefusesWhatArgoSendsAgain: with the default --store-fallback=requeue, a
// completion only the store holds refuses, however old the store's newest write, the pods
// Argo's controller creates again on its next pass (an exit handler; a hook and a step unless
// --cover leaves them out); what a refusal would lose (an agent pod, a TaskSet
// write, a WorkflowFailed Event) it judges as fresh does: refused while the store's newest
// write is younger than --store-fresh-for, admitted (unconfirmed-completion) once older.
func TestRequeueFallbackRefusesWhatArgoSendsAgain(t *testing.T) {
	wf := tableWorkflow
	onExit := argo.NodeID(wf.GetName(), argo.OnExitNodeName(wf.GetName()))
	objects := []struct {
		what    string
		facts   func(t *testing.T) facts
		requeue bool // Argo sends it again when refused
		fresh   bool // fresh refuses it while the store is close behind
	}{
		{"an exit-handler pod", func(t *testing.T) facts { return podFacts(t, fixture.ExitPod(wf)) }, true, true},
		{"a hook pod", func(t *testing.T) facts { return podFacts(t, fixture.Pod(wf, "hook", wf.GetName()+".hooks.running")) }, true, false},
		{"a step pod", func(t *testing.T) facts { return podFacts(t, fixture.Pod(wf, "step", wf.GetName()+"[0].main")) }, true, false},
		{"an agent pod", func(t *testing.T) facts { return podFacts(t, fixture.AgentPod(wf)) }, false, false},
		{"a TaskSet write of the exit handler's task", func(t *testing.T) facts { return taskSetFacts(t, wf, nil, "false", []string{onExit}, "false") }, false, true},
		{"a WorkflowFailed Event", func(t *testing.T) facts { return eventFacts(t, wf, argo.EventReasonWorkflowFailed) }, false, true},
	}
	for _, storeFresh := range []bool{true, false} {
		for _, o := range objects {
			t.Run(o.what+map[bool]string{true: ", the store fresh", false: ", the store 5 minutes behind"}[storeFresh], func(t *testing.T) {
				store, clk := fakeClockStore(t)
				store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: wf.GetNamespace(), Name: wf.GetName(), ResourceVersion: "5", Phase: argo.PhaseSucceeded})
				store.Progress("6")
				store.NoteLag(time.Second)
				if !storeFresh {
					clk.Step(10 * time.Minute / 2) // past --store-fresh-for, inside --completion-ttl
				}
				g, err := newGuard(nil, store, Options{})
				if err != nil {
					t.Fatal(err)
				}
				calls := 0
				g.readLive = cannedRead(liveTimesOut, &calls)
				d := g.decide(t.Context(), o.facts(t))
				want := o.requeue || storeFresh && o.fresh
				if d.deny != want || d.source != sourceStore {
					t.Errorf("deny %v (reason %s, source %s), want deny %v from the store", d.deny, d.reason, d.source, want)
				}
			})
		}
	}
}

// With a watch per namespace (--namespaces), the fresh fallback counts the samples of the
// workflow's own namespace: a busy namespace's watch does not make a stalled one look fresh.
func TestFreshFallbackCountsTheWorkflowsOwnNamespace(t *testing.T) {
	wf := tableWorkflow
	for _, tc := range []struct {
		name         string
		perNamespace bool
		sampleIn     string
		deny         bool
	}{
		{"one watch, a sample of another namespace", false, "busy", true},
		{"a watch per namespace, a sample of another namespace", true, "busy", false},
		{"a watch per namespace, a sample of the workflow's", true, wf.GetNamespace(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, _ := fakeClockStore(t)
			store.SetWatchPerNamespace(tc.perNamespace)
			store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: wf.GetNamespace(), Name: wf.GetName(), ResourceVersion: "5", Phase: argo.PhaseSucceeded})
			store.Progress("5")
			store.NoteLagIn(tc.sampleIn, time.Second)
			g, err := newGuard(nil, store, Options{StoreFallback: FallbackFresh})
			if err != nil {
				t.Fatal(err)
			}
			calls := 0
			g.readLive = cannedRead(liveTimesOut, &calls)
			d := g.decide(t.Context(), podFacts(t, fixture.ExitPod(wf)))
			if d.deny != tc.deny || d.row != "11" {
				t.Errorf("deny %v (reason %s, row %s), want deny %v from row 11", d.deny, d.reason, d.row, tc.deny)
			}
		})
	}
}

// TestStoreOnlyRefusalsEnd: the store alone refuses a workflow's pods for at most
// --store-refusals-for, counted from the first refusal of one continuous run (Argo's
// controller sends a refused pod again every 10 s; a gap of more than storeRunGap ends the
// run) with no live answer since; past it, it admits them as unconfirmed-completion; any live
// answer, a pod's or an Event's, starts the bound again; a new stale pass after a quiet gap
// gets its own bound.
func TestStoreOnlyRefusalsEnd(t *testing.T) {
	wf := tableWorkflow
	store := storeFor(t, wf, storeSucceeded, false)
	g, err := newGuard(nil, store, Options{})
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	g.overturns = newOverturns(clk.Now)
	live := liveFails
	calls := 0
	g.readLive = func(ctx context.Context, namespace, name string, p readPolicy) (*argo.Workflow, error) {
		return cannedRead(live, &calls)(ctx, namespace, name, p)
	}
	decide := func(f facts) decision {
		d := g.decide(t.Context(), f)
		if d.deny {
			// As the pipeline does with every refusal in enforce mode.
			g.overturns.note(f, d)
		}
		return d
	}
	step := func(what string, wantDeny bool, wantReason contract.Reason) {
		t.Helper()
		d := decide(podFacts(t, fixture.ExitPod(wf)))
		if d.deny != wantDeny || d.reason != wantReason {
			t.Errorf("%s: deny %v reason %s (source %s), want deny %v reason %s", what, d.deny, d.reason, d.source, wantDeny, wantReason)
		}
	}
	const requeue = 10 * time.Second // Argo's DEFAULT_REQUEUE_TIME
	// requeues sends the pod again every requeue for d, each refused.
	requeues := func(what string, d time.Duration) {
		t.Helper()
		for range d / requeue {
			clk.Step(requeue)
			step(what, true, contract.ReasonWorkflowCompleted)
		}
	}
	bound := DefaultOptions().StoreRefusalsFor
	step("the first refusal from the store alone", true, contract.ReasonWorkflowCompleted)
	requeues("a refusal within the bound", bound-requeue)
	clk.Step(requeue)
	step("past the bound", false, contract.ReasonUnconfirmedCompletion)
	clk.Step(requeue)
	step("past the bound, Argo trying again", false, contract.ReasonUnconfirmedCompletion)
	clk.Step(3 * time.Minute)
	step("a new stale pass after three quiet minutes: a run of its own", true, contract.ReasonWorkflowCompleted)
	requeues("the new run, within its bound", bound-requeue)
	clk.Step(requeue)
	step("the new run, past its bound", false, contract.ReasonUnconfirmedCompletion)
	live = liveSucceeded
	clk.Step(requeue)
	step("a live read answers: Succeeded", true, contract.ReasonWorkflowCompleted)
	live = liveFails
	clk.Step(requeue)
	step("the store alone again, after the live confirmation", true, contract.ReasonWorkflowCompleted)
	requeues("the store alone, within the bound again", bound-requeue)
	clk.Step(requeue)
	step("past the bound again", false, contract.ReasonUnconfirmedCompletion)
	live = liveRunning
	step("a live read answers: Running", false, contract.ReasonWorkflowNotTerminal)
	live = liveFails
	step("the store alone, after a live answer of any phase: the bound starts again", true, contract.ReasonWorkflowCompleted)
	requeues("within the bound", bound/2)
	live = liveSucceeded
	if d := decide(eventFacts(t, wf, argo.EventReasonWorkflowFailed)); d.source != sourceLive || !d.deny {
		t.Fatalf("the failure Event, read live: %+v", d)
	}
	live = liveFails
	requeues("after an Event's live answer: the bound starts again", bound-requeue)
}
