package webhook

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// overturnRig is a guard whose live read answers as live says, with a store at a fake clock that
// holds the table's workflow Succeeded at resourceVersion 5, its watch close behind (fresh).
type overturnRig struct {
	g        *guard
	h        *handler
	store    *completionstore.Store
	clk      *clocktesting.FakeClock
	recorder *events.FakeRecorder
	live     *liveAnswer
}

func newOverturnRig(t *testing.T) *overturnRig {
	t.Helper()
	store, clk := fakeClockStore(t)
	store.Progress("5")
	store.NoteLag(time.Millisecond)
	r := &overturnRig{store: store, clk: clk, recorder: events.NewFakeRecorder(10), live: ptr.To(liveFails)}
	r.observe("5", argo.PhaseSucceeded)
	var err error
	if r.g, err = newGuard(nil, store, Options{}); err != nil {
		t.Fatal(err)
	}
	r.g.overturns.now = clk.Now
	r.g.recorder = r.recorder
	store.OnObserve(r.g.observedByStore) // as Setup does
	calls := 0
	r.g.readLive = func(ctx context.Context, namespace, name string, p readPolicy) (*argo.Workflow, error) {
		wf, err := cannedRead(*r.live, &calls)(ctx, namespace, name, p)
		if err == nil {
			// As the store holds it: what a live read would see now.
			rec, _ := store.Get(tableWorkflow.GetUID())
			wf.ResourceVersion = rec.ResourceVersion
		}
		return wf, err
	}
	r.h = r.g.path(ValidatePath, readPodReview)
	return r
}

// observe records a state of the table's workflow, as the guard's watch delivers it, its write
// time unknown.
func (r *overturnRig) observe(rv string, phase argo.Phase) {
	r.observeWritten(rv, phase, time.Time{})
}

// observeWritten records a state of the table's workflow written at writtenAt.
func (r *overturnRig) observeWritten(rv string, phase argo.Phase, writtenAt time.Time) {
	wf := tableWorkflow
	r.store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: wf.GetNamespace(), Name: wf.GetName(), ResourceVersion: rv, Phase: phase, WrittenAt: writtenAt})
	r.store.Progress(rv)
	r.store.NoteLag(time.Millisecond)
}

// create sends the table workflow's exit-handler pod through the pipeline and says whether it
// was admitted.
func (r *overturnRig) create(t *testing.T, dryRun bool) bool {
	t.Helper()
	var req request
	resp := r.h.handle(t.Context(), reviewBody(admissionv1.AdmissionRequest{
		UID: "u", Operation: admissionv1.Create, Resource: podResource, DryRun: ptr.To(dryRun),
		Object: runtime.RawExtension{Raw: fixture.JSON(fixture.ExitPod(tableWorkflow))},
	}), &req)
	return resp.Allowed
}

func (r *overturnRig) overturned(t *testing.T) float64 {
	t.Helper()
	return value(t, r.g.overturns.counter.WithLabelValues(string(kindPod)))
}

// wantOverturned expects the refusals counted overturned so far to be want.
func (r *overturnRig) wantOverturned(t *testing.T, want float64) {
	t.Helper()
	if got := r.overturned(t); got != want {
		t.Errorf("overturned = %v, want %v", got, want)
	}
}

// events are the Events recorded so far with reason.
func (r *overturnRig) events(reason string) []string {
	var out []string
	for {
		select {
		case e := <-r.recorder.Events:
			if strings.Contains(e, " "+reason+" ") {
				out = append(out, e)
			}
		default:
			return out
		}
	}
}

// A refusal made from the store alone, while the live read fails, and then the workflow seen
// running at a newer resourceVersion: the refusal is counted overturned once, with a Warning
// Event that says how many refusals and how long since the first; refusals the guard was sure
// of, dry runs and old ones are not.
func TestRefusalsFromTheStoreAloneAreCheckedAgainstWhatFollows(t *testing.T) {
	t.Run("refused twice from the store, then seen running before the next try is decided: counted once", func(t *testing.T) {
		r := newOverturnRig(t)
		for range 2 {
			if r.create(t, false) {
				t.Fatal("the exit handler of a workflow the store holds Succeeded was admitted while the read fails")
			}
		}
		r.clk.Step(3 * time.Second)
		r.observe("7", argo.PhaseRunning) // a retry, delivered late
		if !r.create(t, false) {
			t.Fatal("the exit handler of a workflow the store holds Running was refused")
		}
		r.wantOverturned(t, 1)
		evs := r.events(contract.EventReasonRefusalOverturned)
		if len(evs) != 1 || !strings.Contains(evs[0], "2 time(s)") || !strings.Contains(evs[0], "resourceVersion 7") || !strings.Contains(evs[0], "3s since the first refusal") {
			t.Errorf("Events = %q, want one that says 2 refusals, resourceVersion 7, 3s", evs)
		}
		r.create(t, false)
		if got := r.overturned(t); got != 1 {
			t.Errorf("after another admission overturned = %v, want still 1", got)
		}
	})
	t.Run("seen running by the watch alone, late, completed again by then: counted from the state it passed", func(t *testing.T) {
		r := newOverturnRig(t)
		r.create(t, false)
		r.observe("7", argo.PhaseRunning)
		r.observe("9", argo.PhaseSucceeded)
		r.g.sweepOverturns(t.Context())
		r.wantOverturned(t, 1)
	})
	t.Run("seen running by the live read of Argo's next try, the watch still behind: counted", func(t *testing.T) {
		r := newOverturnRig(t)
		r.create(t, false)
		*r.live = liveRunning
		if !r.create(t, false) {
			t.Fatal("the exit handler of a workflow a live read finds running was refused")
		}
		r.wantOverturned(t, 1)
	})
	t.Run("seen running by the sweep of the store", func(t *testing.T) {
		r := newOverturnRig(t)
		r.create(t, false)
		// Recorded without the listeners (as before Setup registered them).
		r.g.store = storeFor(t, tableWorkflow, storeRunning, false)
		r.g.store.Observe(completionstore.Observation{UID: tableWorkflow.GetUID(), Namespace: tableWorkflow.GetNamespace(), Name: tableWorkflow.GetName(), ResourceVersion: "7", Phase: argo.PhaseRunning})
		r.g.sweepOverturns(t.Context())
		r.wantOverturned(t, 1)
	})
	t.Run("a retry written after the refusal (a right refusal, retried later): not counted", func(t *testing.T) {
		r := newOverturnRig(t)
		r.create(t, false)
		r.clk.Step(time.Minute)
		r.observeWritten("7", argo.PhaseRunning, r.clk.Now())
		r.g.sweepOverturns(t.Context())
		r.wantOverturned(t, 0)
	})
	t.Run("a later write seen first, then the retry written before the refusal, delivered late: counted", func(t *testing.T) {
		r := newOverturnRig(t)
		refusedAt := r.clk.Now()
		r.create(t, false)
		r.clk.Step(10 * time.Second)
		// A live read records the newest state (Argo's write after the refused pass) first.
		r.observeWritten("9", argo.PhaseRunning, r.clk.Now())
		if got := r.overturned(t); got != 0 {
			t.Fatalf("overturned = %v by a state written after the refusal, want 0", got)
		}
		r.observeWritten("7", argo.PhaseRunning, refusedAt.Add(-time.Second))
		r.wantOverturned(t, 1)
	})
	t.Run("refused by a live read, then retried: not counted", func(t *testing.T) {
		r := newOverturnRig(t)
		*r.live = liveSucceeded
		if r.create(t, false) {
			t.Fatal("admitted")
		}
		r.observe("7", argo.PhaseRunning)
		*r.live = liveRunning
		r.create(t, false)
		r.g.sweepOverturns(t.Context())
		if got := r.overturned(t); got != 0 {
			t.Errorf("overturned = %v, want 0: a live read is never older than the newest write", got)
		}
	})
	t.Run("refused because the store saw the workflow deleted: not remembered (a UID never comes back)", func(t *testing.T) {
		r := newOverturnRig(t)
		wf := tableWorkflow
		r.store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: wf.GetNamespace(), Name: wf.GetName(), ResourceVersion: "6", Phase: argo.PhaseSucceeded, Deleted: true})
		if r.create(t, false) {
			t.Fatal("the exit handler of a deleted workflow was admitted")
		}
		if n := r.g.overturns.size.Load(); n != 0 {
			t.Errorf("%d refusals remembered, want 0", n)
		}
	})
	t.Run("a dry run refused from the store: not counted", func(t *testing.T) {
		r := newOverturnRig(t)
		r.create(t, true)
		r.observe("7", argo.PhaseRunning)
		r.create(t, false)
		r.wantOverturned(t, 0)
	})
	t.Run("still completed at a newer resourceVersion: not counted", func(t *testing.T) {
		r := newOverturnRig(t)
		r.create(t, false)
		r.observe("7", argo.PhaseSucceeded)
		r.g.sweepOverturns(t.Context())
		r.wantOverturned(t, 0)
	})
	t.Run("seen running only after the window: not counted, forgotten", func(t *testing.T) {
		r := newOverturnRig(t)
		r.create(t, false)
		r.clk.Step(overturnWindow + time.Second)
		r.g.sweepOverturns(t.Context())
		if n := r.g.overturns.size.Load(); n != 0 {
			t.Errorf("%d refusals remembered past the window, want 0", n)
		}
		r.observe("7", argo.PhaseRunning)
		r.create(t, false)
		r.wantOverturned(t, 0)
	})
}

// A retry that ran while the store refused its pods, and completed again before the guard's
// watch relisted, shows to the guard only as a newer completion: the sweep reads that workflow
// whole, once per newer completion, and counts the refusals overturned when its run started
// after the refused completion was written and before the last refusal (argo retry sets
// status.startedAt anew).
func TestOverturnsAcrossARelist(t *testing.T) {
	// rig: the table's workflow completed (written a minute ago) and refused from the store
	// alone; then only a newer completion at resourceVersion 9 is seen (a relist). A read of
	// the whole workflow answers with a run that started at startedAt.
	rig := func(t *testing.T, startedAt func(completedAt, refusedAt time.Time) time.Time) (*overturnRig, *int) {
		t.Helper()
		r := newOverturnRig(t)
		completedAt := r.clk.Now().Add(-time.Minute).Truncate(time.Second)
		r.observeWritten("6", argo.PhaseSucceeded, completedAt)
		refusedAt := r.clk.Now()
		if r.create(t, false) {
			t.Fatal("the exit handler of a workflow the store holds Succeeded was admitted while the read fails")
		}
		r.clk.Step(30 * time.Second)
		r.observeWritten("9", argo.PhaseSucceeded, r.clk.Now())
		reads := new(int)
		r.g.readWhole = func(_ context.Context, namespace, name string) (*argo.Workflow, error) {
			*reads++
			wf := &argo.Workflow{}
			wf.Namespace, wf.Name, wf.UID, wf.ResourceVersion = namespace, name, tableWorkflow.GetUID(), "9"
			wf.Status.Phase, wf.Status.StartedAt = argo.PhaseSucceeded, metav1.NewTime(startedAt(completedAt, refusedAt))
			return wf, nil
		}
		return r, reads
	}
	t.Run("retried before the refusal, its running state skipped: counted once, from one read", func(t *testing.T) {
		r, reads := rig(t, func(_, refusedAt time.Time) time.Time { return refusedAt.Add(-10 * time.Second) })
		r.g.sweepOverturns(t.Context())
		r.g.sweepOverturns(t.Context())
		r.wantOverturned(t, 1)
		if *reads != 1 {
			t.Errorf("the workflow was read %d times, want 1", *reads)
		}
		evs := r.events(contract.EventReasonRefusalOverturned)
		if len(evs) != 1 || !strings.Contains(evs[0], "Succeeded again after a run that started at") || !strings.Contains(evs[0], "resourceVersion 9") {
			t.Errorf("Events = %q, want one that says the workflow ran again", evs)
		}
	})
	t.Run("retried after the last refusal (a right refusal): not counted, read once", func(t *testing.T) {
		r, reads := rig(t, func(_, refusedAt time.Time) time.Time { return refusedAt.Add(10 * time.Second) })
		r.g.sweepOverturns(t.Context())
		r.g.sweepOverturns(t.Context())
		r.wantOverturned(t, 0)
		if *reads != 1 {
			t.Errorf("the workflow was read %d times, want 1", *reads)
		}
	})
	t.Run("a later write of the same run (artifact GC, a label): not counted", func(t *testing.T) {
		r, _ := rig(t, func(completedAt, _ time.Time) time.Time { return completedAt.Add(-5 * time.Minute) })
		r.g.sweepOverturns(t.Context())
		r.wantOverturned(t, 0)
	})
	t.Run("the read fails: not counted, read again at the next sweep", func(t *testing.T) {
		r, reads := rig(t, func(_, refusedAt time.Time) time.Time { return refusedAt.Add(-10 * time.Second) })
		ok := r.g.readWhole
		r.g.readWhole = func(context.Context, string, string) (*argo.Workflow, error) {
			*reads++
			return nil, errors.New("the API server does not answer")
		}
		r.g.sweepOverturns(t.Context())
		r.wantOverturned(t, 0)
		r.g.readWhole = ok
		r.g.sweepOverturns(t.Context())
		r.wantOverturned(t, 1)
		if *reads != 2 {
			t.Errorf("the workflow was read %d times, want 2 (the failed read, then the next sweep's)", *reads)
		}
	})
	t.Run("more workflows to read than a sweep reads: the rest at the next sweeps", func(t *testing.T) {
		store, clk := fakeClockStore(t)
		g, err := newGuard(nil, store, Options{})
		if err != nil {
			t.Fatal(err)
		}
		g.overturns.now = clk.Now
		n := 2*maxRerunChecksPerSweep + 3
		completedAt := clk.Now().Add(-time.Minute).Truncate(time.Second)
		f := podFacts(t, fixture.ExitPod(tableWorkflow))
		for i := range n {
			uid := types.UID("uid-" + strconv.Itoa(i))
			name := "wf-" + strconv.Itoa(i)
			store.Observe(completionstore.Observation{UID: uid, Namespace: "ns", Name: name, ResourceVersion: "6", Phase: argo.PhaseSucceeded, WrittenAt: completedAt})
			d := refused(contract.ReasonWorkflowCompleted)
			d.source, d.wfUID, d.wfNamespace, d.wfName, d.phase, d.resourceVersion, d.writtenAt = sourceStore, uid, "ns", name, argo.PhaseSucceeded, "6", completedAt
			g.overturns.note(f, d)
		}
		clk.Step(30 * time.Second)
		for i := range n {
			store.Observe(completionstore.Observation{UID: types.UID("uid-" + strconv.Itoa(i)), Namespace: "ns", Name: "wf-" + strconv.Itoa(i),
				ResourceVersion: "9", Phase: argo.PhaseSucceeded, WrittenAt: clk.Now()})
		}
		read := 0
		g.readWhole = func(_ context.Context, namespace, name string) (*argo.Workflow, error) {
			read++
			wf := &argo.Workflow{}
			wf.Namespace, wf.Name, wf.UID, wf.ResourceVersion = namespace, name, types.UID("uid-"+strings.TrimPrefix(name, "wf-")), "9"
			wf.Status.Phase, wf.Status.StartedAt = argo.PhaseSucceeded, metav1.NewTime(completedAt.Add(10*time.Second))
			return wf, nil
		}
		for sweep := 1; sweep <= 3; sweep++ {
			g.sweepOverturns(t.Context())
			if want := min(n, sweep*maxRerunChecksPerSweep); read != want {
				t.Errorf("after sweep %d: %d workflows read, want %d", sweep, read, want)
			}
		}
		if got := value(t, g.overturns.counter.WithLabelValues(string(kindPod))); got != float64(n) {
			t.Errorf("overturned = %v, want %d: every workflow ran again before its refusal", got, n)
		}
	})
}

// The refusals remembered are bounded: past maxOverturnEntries workflows the oldest refusal
// is forgotten.
func TestOverturnsAreBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	o := newOverturns(clk.Now)
	f := podFacts(t, fixture.ExitPod(tableWorkflow))
	for i := range maxOverturnEntries + 10 {
		clk.Step(time.Millisecond)
		d := refused(contract.ReasonWorkflowCompleted)
		d.source, d.wfUID = sourceStore, tableWorkflow.GetUID()+types.UID("-"+strconv.Itoa(i))
		o.note(f, d)
	}
	if n := o.size.Load(); n != maxOverturnEntries {
		t.Errorf("%d remembered, want %d", n, maxOverturnEntries)
	}
	if _, ok := o.entries[tableWorkflow.GetUID()+"-0"]; ok {
		t.Error("the oldest refusal is still remembered")
	}
}

// TestAStoreListenerThatPanicsDoesNotEndTheWatch: the guard's listeners run on the Workflow
// watch's goroutine, where a panic would end the process; a panic is recovered, counted and
// the next observation is checked again.
func TestAStoreListenerThatPanicsDoesNotEndTheWatch(t *testing.T) {
	store, _ := fakeClockStore(t)
	g, err := newGuard(nil, store, Options{})
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	store.OnObserve(g.recovered("test", func(o completionstore.Observation) {
		seen++
		if o.ResourceVersion == "1" {
			panic("a bug in a listener")
		}
	}))
	for _, rv := range []string{"1", "2"} {
		store.Observe(completionstore.Observation{UID: "u", Namespace: "argo", Name: "wf", ResourceVersion: rv, Phase: argo.PhaseRunning})
	}
	if seen != 2 {
		t.Errorf("the listener saw %d observations, want 2: the one after the panic too", seen)
	}
	var m dto.Metric
	if err := g.metrics.panics.WithLabelValues(panicStoreListener).Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 1 {
		t.Errorf("exit_guard_panics_total{where=%q} = %v, want 1", panicStoreListener, got)
	}
}
