package completionstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/exit-guard/exit-guard/internal/argo"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func newTestStore(t *testing.T) (*Store, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	s, err := New(Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return s, clk
}

func obs(uid, rv string, phase argo.Phase) Observation {
	return Observation{UID: types.UID(uid), Namespace: "ns", Name: "wf", ResourceVersion: rv, Phase: phase}
}

func deleted(o Observation) Observation { o.Deleted = true; return o }

func TestObserveKeepsTheNewestStateOfEachUID(t *testing.T) {
	tests := []struct {
		name      string
		events    []Observation
		wantPhase argo.Phase
		wantRV    string
		wantDel   bool
		results   []Result
	}{{
		name:      "a completion is recorded",
		events:    []Observation{obs("a", "10", argo.PhaseRunning), obs("a", "20", argo.PhaseSucceeded)},
		wantPhase: argo.PhaseSucceeded, wantRV: "20",
		results: []Result{Applied, Applied},
	}, {
		name:      "an older event after a completion does not bring back Running",
		events:    []Observation{obs("a", "20", argo.PhaseSucceeded), obs("a", "10", argo.PhaseRunning)},
		wantPhase: argo.PhaseSucceeded, wantRV: "20",
		results: []Result{Applied, Stale},
	}, {
		name:      "a replayed completion after a retry does not bring the completion back",
		events:    []Observation{obs("a", "20", argo.PhaseSucceeded), obs("a", "30", argo.PhaseRunning), obs("a", "20", argo.PhaseSucceeded)},
		wantPhase: argo.PhaseRunning, wantRV: "30",
		results: []Result{Applied, Applied, Stale},
	}, {
		name:      "a v4 retry (phase empty) clears the completion",
		events:    []Observation{obs("a", "20", argo.PhaseSucceeded), obs("a", "30", argo.PhaseUnknown)},
		wantPhase: argo.PhaseUnknown, wantRV: "30",
		results: []Result{Applied, Applied},
	}, {
		name:      "resourceVersions compare as numbers, not strings",
		events:    []Observation{obs("a", "9", argo.PhaseRunning), obs("a", "10", argo.PhaseSucceeded), obs("a", "9", argo.PhaseRunning)},
		wantPhase: argo.PhaseSucceeded, wantRV: "10",
		results: []Result{Applied, Applied, Stale},
	}, {
		name:      "a deletion at the last resourceVersion makes a tombstone that keeps the phase",
		events:    []Observation{obs("a", "20", argo.PhaseSucceeded), deleted(obs("a", "20", argo.PhaseUnknown))},
		wantPhase: argo.PhaseSucceeded, wantRV: "20", wantDel: true,
		results: []Result{Applied, Applied},
	}, {
		name:      "a tombstone is never undone",
		events:    []Observation{deleted(obs("a", "30", argo.PhaseFailed)), obs("a", "40", argo.PhaseRunning)},
		wantPhase: argo.PhaseFailed, wantRV: "30", wantDel: true,
		results: []Result{Applied, Stale},
	}, {
		name: "a deletion reported with an older copy than a live read gave still wins",
		// Seen at 100 by the watch, read live at 105; the informer relists and reports the
		// deletion it missed (DeletedFinalStateUnknown) with the object it had, at 100.
		events:    []Observation{obs("a", "100", argo.PhaseRunning), obs("a", "105", argo.PhaseSucceeded), deleted(obs("a", "100", argo.PhaseRunning))},
		wantPhase: argo.PhaseSucceeded, wantRV: "105", wantDel: true,
		results: []Result{Applied, Applied, Applied},
	}, {
		name:      "a deletion of a UID never seen makes a tombstone",
		events:    []Observation{deleted(obs("a", "7", argo.PhaseRunning))},
		wantPhase: argo.PhaseRunning, wantRV: "7", wantDel: true,
		results: []Result{Applied},
	}, {
		name:      "a second deletion changes nothing",
		events:    []Observation{deleted(obs("a", "30", argo.PhaseSucceeded)), deleted(obs("a", "20", argo.PhaseRunning))},
		wantPhase: argo.PhaseSucceeded, wantRV: "30", wantDel: true,
		results: []Result{Applied, Stale},
	}, {
		name:      "a duplicate event is stale",
		events:    []Observation{obs("a", "20", argo.PhaseSucceeded), obs("a", "20", argo.PhaseSucceeded)},
		wantPhase: argo.PhaseSucceeded, wantRV: "20",
		results: []Result{Applied, Stale},
	}, {
		// The watch saw the workflow without its status (its labels did not tell the phase);
		// a live read of the same resourceVersion read the status.
		name:      "the same resourceVersion with the phase the store could not tell is applied",
		events:    []Observation{obs("a", "20", argo.PhaseUnsettled), obs("a", "20", argo.PhaseSucceeded)},
		wantPhase: argo.PhaseSucceeded, wantRV: "20",
		results: []Result{Applied, Applied},
	}, {
		name:      "the same resourceVersion seen again without its status keeps the phase",
		events:    []Observation{obs("a", "20", argo.PhaseSucceeded), obs("a", "20", argo.PhaseUnsettled)},
		wantPhase: argo.PhaseSucceeded, wantRV: "20",
		results: []Result{Applied, Stale},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newTestStore(t)
			var got []Result
			for _, e := range tt.events {
				got = append(got, s.Observe(e))
			}
			if diff := cmp.Diff(tt.results, got); diff != "" {
				t.Errorf("Observe results (-want +got):\n%s", diff)
			}
			r, ok := s.Get("a")
			if !ok {
				t.Fatal("no record")
			}
			if r.Phase != tt.wantPhase || r.ResourceVersion != tt.wantRV || r.Deleted != tt.wantDel {
				t.Errorf("record = phase %q rv %q deleted %v, want %q %q %v", r.Phase, r.ResourceVersion, r.Deleted, tt.wantPhase, tt.wantRV, tt.wantDel)
			}
		})
	}
}

func TestRecordsAreKeyedByUIDNotName(t *testing.T) {
	s, _ := newTestStore(t)
	s.Observe(obs("old-uid", "20", argo.PhaseSucceeded))
	s.Observe(obs("new-uid", "5", argo.PhaseRunning)) // same namespace/name, re-created
	if r, _ := s.Get("old-uid"); r.Phase != argo.PhaseSucceeded {
		t.Errorf("old uid phase = %q, want Succeeded", r.Phase)
	}
	if r, _ := s.Get("new-uid"); r.Phase != argo.PhaseRunning {
		t.Errorf("new uid phase = %q, want Running", r.Phase)
	}
}

func TestInvalidObservationsAreRefused(t *testing.T) {
	s, _ := newTestStore(t)
	for _, o := range []Observation{obs("", "1", argo.PhaseSucceeded), obs("a", "", argo.PhaseSucceeded), obs("a", "x1", argo.PhaseSucceeded)} {
		if got := s.Observe(o); got != Invalid {
			t.Errorf("Observe(%+v) = %v, want invalid", o, got)
		}
	}
	if s.Len() != 0 {
		t.Errorf("store holds %d records after invalid observations", s.Len())
	}
}

func TestRecordsExpireATTLAfterTheirLastChange(t *testing.T) {
	s, clk := newTestStore(t)
	s.Observe(obs("a", "10", argo.PhaseSucceeded))
	clk.Step(DefaultOptions().TTL - time.Second)
	if _, ok := s.Get("a"); !ok {
		t.Fatal("record gone before its TTL")
	}
	clk.Step(time.Second)
	if _, ok := s.Get("a"); ok {
		t.Fatal("record still returned at its TTL")
	}
	if n := s.Sweep(); n != 1 || s.Len() != 0 {
		t.Errorf("Sweep removed %d, %d left; want 1, 0", n, s.Len())
	}
	// An expired record no longer orders anything: the next state is recorded as new.
	s.Observe(obs("b", "10", argo.PhaseSucceeded))
	clk.Step(DefaultOptions().TTL)
	if got := s.Observe(obs("b", "5", argo.PhaseRunning)); got != Applied {
		t.Errorf("Observe after expiry = %v, want applied", got)
	}
}

func TestSweeperRunsOnItsInterval(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	s, err := New(Options{Clock: clk, TTL: time.Minute, SweepInterval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.Observe(obs("a", "1", argo.PhaseSucceeded))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return clk.HasWaiters(), nil }); err != nil {
		t.Fatal("sweeper never started its ticker")
	}
	clk.Step(time.Minute + 10*time.Second)
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return s.Len() == 0, nil }); err != nil {
		t.Fatalf("sweeper did not remove the expired record: %d left", s.Len())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start returned %v", err)
	}
	if s.NeedLeaderElection() {
		t.Error("the sweeper must run on every replica")
	}
}

func TestNewRefusesNegativeDurations(t *testing.T) {
	for _, o := range []Options{{TTL: -time.Second}, {SweepInterval: -time.Second}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted a negative duration", o)
		}
	}
	s, err := New(Options{})
	if err != nil || s.TTL() != DefaultOptions().TTL {
		t.Errorf("New with zero options: ttl %v err %v", s.TTL(), err)
	}
}

func TestConcurrentObserveAndGet(t *testing.T) {
	s, _ := newTestStore(t)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				s.Observe(obs(fmt.Sprint("uid-", i%50), fmt.Sprint(i*4+w+1), argo.PhaseSucceeded))
			}
		})
		wg.Go(func() {
			for i := range 1000 {
				s.Get(types.UID(fmt.Sprint("uid-", i%50)))
			}
		})
	}
	wg.Wait()
	if s.Len() != 50 {
		t.Errorf("store holds %d records, want 50", s.Len())
	}
}

func TestFeederHandlesTombstonesFromTheInformer(t *testing.T) {
	s, _ := newTestStore(t)
	f := &feeder{store: s, metrics: newStoreMetrics(s)}
	wf := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wf", UID: "a", ResourceVersion: "7",
		Labels: map[string]string{argo.LabelPhase: "Succeeded", argo.LabelCompleted: "true"}}}
	f.observe(wf, false)
	f.observe(toolscache.DeletedFinalStateUnknown{Key: "ns/wf", Obj: wf}, false)
	f.observe("not a workflow", false)
	r, ok := s.Get("a")
	if !ok || !r.Deleted || r.Phase != argo.PhaseSucceeded {
		t.Errorf("record after DeletedFinalStateUnknown = %+v, %v; want a Succeeded tombstone", r, ok)
	}
}

func TestFeederCountsCompletionsItSees(t *testing.T) {
	s, _ := newTestStore(t)
	f := &feeder{store: s, metrics: newStoreMetrics(s)}
	wf := func(rv string, phase argo.Phase) *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wf", UID: "a", ResourceVersion: rv,
			Labels: phaseLabels[phase]}}
	}
	f.completed(wf("1", argo.PhasePending), wf("2", argo.PhaseRunning))     // not a completion
	f.completed(wf("2", argo.PhaseRunning), wf("3", argo.PhaseSucceeded))   // one
	f.completed(wf("3", argo.PhaseSucceeded), wf("4", argo.PhaseSucceeded)) // already complete
	f.completed(wf("4", argo.PhaseRunning), wf("5", argo.PhaseError))       // a retried one, again
	f.completed(wf("5", argo.PhaseUnsettled), wf("6", argo.PhaseFailed))    // from a phase not known
	f.completed("not a workflow", wf("7", argo.PhaseFailed))
	m := &dto.Metric{}
	if err := f.metrics.completions.Write(m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 2 {
		t.Errorf("exit_guard_workflow_completions_total = %v, want 2", got)
	}
}

func TestStripWorkflowKeepsOnlyWhatTheStoreNeeds(t *testing.T) {
	in := &metav1.PartialObjectMetadata{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wf", UID: "u", ResourceVersion: "3",
			Labels:      map[string]string{"a": "b", argo.LabelPhase: "Failed", argo.LabelCompleted: "true"},
			Annotations: map[string]string{"big": "x"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
	}
	out, err := stripWorkflow(in)
	if err != nil {
		t.Fatal(err)
	}
	want := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wf", UID: "u", ResourceVersion: "3",
		Labels: map[string]string{argo.LabelPhase: "Failed", argo.LabelCompleted: "true"}}}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("stripped workflow (-want +got):\n%s", diff)
	}
	if o := ObservationOfMetadata(out.(*metav1.PartialObjectMetadata), false); o.Phase != argo.PhaseFailed {
		t.Errorf("observation of the stripped workflow has phase %q, want Failed", o.Phase)
	}

	// The newest write's time (the lag sample's) rides in CreationTimestamp.
	created, older, newest := metav1.NewTime(t0.Add(-time.Hour)), metav1.NewTime(t0.Add(-time.Minute)), metav1.NewTime(t0)
	in.CreationTimestamp = created
	in.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "a", Time: &newest}, {Manager: "b", Time: &older}, {Manager: "c"}}
	out, err = stripWorkflow(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.(*metav1.PartialObjectMetadata); !got.CreationTimestamp.Equal(&newest) || got.ManagedFields != nil {
		t.Errorf("stripped workflow carries %v with managed fields %v, want the newest write %v and no managed fields", got.CreationTimestamp, got.ManagedFields, newest)
	}
}

// A workflow whose labels do not settle its phase is recorded as such, never as the phase its
// label names.
func TestObservationsOfMetadataThatDoNotSettleThePhase(t *testing.T) {
	s, _ := newTestStore(t)
	meta := func(rv string, labels map[string]string) *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wf", UID: "a", ResourceVersion: rv, Labels: labels}}
	}
	s.Observe(ObservationOfMetadata(meta("5", map[string]string{argo.LabelPhase: "Failed", argo.LabelCompleted: "true"}), false))
	// Retried by v4.0+: status.phase "", the completed label removed, the phase label stale.
	s.Observe(ObservationOfMetadata(meta("6", map[string]string{argo.LabelPhase: "Failed"}), false))
	if r, _ := s.Get("a"); r.Phase != argo.PhaseUnsettled || r.ResourceVersion != "6" {
		t.Errorf("record after the retry = %+v, want phase Unsettled at 6", r)
	}
	if terminal, _, active := s.Counts(); terminal != 0 || active != 1 {
		t.Errorf("counts terminal %d, active %d; want an unsettled record counted active", terminal, active)
	}
	s.Observe(ObservationOfMetadata(meta("6", map[string]string{argo.LabelPhase: "Failed"}), true))
	if r, _ := s.Get("a"); !r.Deleted || r.Phase != argo.PhaseUnsettled {
		t.Errorf("tombstone = %+v, want deleted with phase Unsettled", r)
	}
}

func TestWatchProgressOnlyMovesForwardAndGoesStale(t *testing.T) {
	s, clk := newTestStore(t)
	if s.WatchFresh() {
		t.Error("a watch that never advanced is fresh")
	}
	if stale, ok := s.Staleness(); ok {
		t.Errorf("a store that took no lag sample has a staleness, %s", stale)
	}
	for _, step := range []struct {
		rv       string
		advanced bool
	}{{"9", true}, {"10", true}, {"9", false}, {"10", false}, {"", false}, {"not-a-number", false}, {"11", true}} {
		if got := s.Progress(step.rv); got != step.advanced {
			t.Errorf("Progress(%q) = %v, want %v", step.rv, got, step.advanced)
		}
		clk.Step(time.Second)
	}
	if rv, at := s.LastProgress(); rv != "11" || !at.Equal(t0.Add(6*time.Second)) {
		t.Errorf("LastProgress = %q at %v, want 11 at %v", rv, at, t0.Add(6*time.Second))
	}
	// Progress alone tells no time; a lag sample does, and ages with the clock.
	if _, ok := s.Staleness(); ok {
		t.Error("progress without a lag sample gave a staleness")
	}
	s.NoteLag(2 * time.Second)
	clk.Step(3 * time.Second)
	if stale, ok := s.Staleness(); !ok || stale != 5*time.Second {
		t.Errorf("Staleness = %s, %v; want 5s (a write 2 s old on arrival, 3 s ago)", stale, ok)
	}
	clk.Step(-3 * time.Second)
	clk.Step(DefaultOptions().WatchStaleAfter - 2*time.Second)
	if !s.WatchFresh() {
		t.Error("the watch went stale before WatchStaleAfter")
	}
	clk.Step(time.Second)
	if s.WatchFresh() {
		t.Error("the watch is still fresh WatchStaleAfter after it last advanced")
	}
	s.Progress("12")
	if !s.WatchFresh() {
		t.Error("the watch is not fresh again once it advanced")
	}
}

// TestWatchFreshnessPerNamespace: with a watch per namespace (--namespaces), one busy
// namespace's events do not make a stuck namespace's watch look fresh; with one watch, any
// event does.
func TestWatchFreshnessPerNamespace(t *testing.T) {
	s, clk := newTestStore(t)
	s.SetWatchPerNamespace(true)
	s.ProgressIn("stuck", "5")
	if !s.WatchFreshIn("stuck") {
		t.Error("a namespace's watch that just advanced is not fresh")
	}
	if s.WatchFreshIn("quiet") {
		t.Error("a namespace whose watch delivered nothing is fresh")
	}
	rv := 6
	for range 4 {
		// The busy namespace advances every minute; the stuck one never again.
		clk.Step(time.Minute)
		s.ProgressIn("busy", strconv.Itoa(rv))
		rv++
	}
	if !s.WatchFresh() || !s.WatchFreshIn("busy") {
		t.Error("the busy namespace's watch, which advanced a minute ago, is not fresh")
	}
	if s.WatchFreshIn("stuck") {
		t.Error("the stuck namespace's watch looks fresh because another namespace's advanced")
	}
	if s.ProgressIn("busy", "6"); !s.WatchFreshIn("busy") {
		t.Error("an older resourceVersion took the busy namespace's progress back")
	}
	one, clk1 := newTestStore(t)
	one.ProgressIn("a", "5")
	clk1.Step(4 * time.Minute)
	one.ProgressIn("b", "6")
	if !one.WatchFreshIn("a") {
		t.Error("with one watch, an event of any namespace is progress for all")
	}
}

// fakeInformer reports a resourceVersion, as an informer does after an event or a bookmark.
type fakeInformer struct{ rv atomic.Value }

func (f *fakeInformer) LastSyncResourceVersion() string { s, _ := f.rv.Load().(string); return s }

func TestProgressPollerSeesBookmarks(t *testing.T) {
	s, clk := newTestStore(t)
	inf := &fakeInformer{}
	inf.rv.Store("5")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- (&progressPoller{store: s, informer: inf, interval: time.Second}).Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for _, rv := range []string{"5", "8"} {
		inf.rv.Store(rv)
		if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true,
			func(context.Context) (bool, error) {
				clk.Step(time.Second) // the ticker fires when the poller waits on it
				got, _ := s.LastProgress()
				return got == rv, nil
			}); err != nil {
			t.Fatalf("the poller never recorded resourceVersion %s", rv)
		}
	}
}

// OnObserve: every observation Observe applies reaches the listeners, in order and as
// recorded (a tombstone keeps the newest state known); stale ones do not.
func TestListenersSeeEveryAppliedObservation(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	s.OnObserve(func(o Observation) { got = append(got, fmt.Sprintf("%s %s %v", o.ResourceVersion, o.Phase, o.Deleted)) })
	for _, o := range []Observation{
		{UID: "u", ResourceVersion: "5", Phase: argo.PhaseRunning},
		{UID: "u", ResourceVersion: "4", Phase: argo.PhaseSucceeded}, // stale
		{UID: "u", ResourceVersion: "7", Phase: argo.PhaseSucceeded},
		{UID: "u", ResourceVersion: "6", Phase: argo.PhaseRunning, Deleted: true},      // deletion of an older copy
		{UID: "u", ResourceVersion: "not a resourceVersion", Phase: argo.PhaseRunning}, // invalid
	} {
		s.Observe(o)
	}
	want := []string{"5 Running false", "4 Succeeded false", "7 Succeeded false", "7 Succeeded true"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("listener saw (-want +got):\n%s", diff)
	}
}

// StalenessIn: with one watch for every namespace any sample tells how far behind it is; with a
// watch per namespace, only the namespace's own samples do, so that a busy namespace cannot
// make a stalled one look fresh.
func TestStalenessIsPerNamespaceWithAWatchPerNamespace(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	s, err := New(Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	s.SetWatchPerNamespace(true)
	s.NoteLagIn("quiet", time.Second)
	clk.Step(time.Minute)
	s.NoteLagIn("busy", 2*time.Second)
	clk.Step(time.Second)
	for _, tc := range []struct {
		perNamespace bool
		namespace    string
		want         time.Duration
		known        bool
	}{
		{false, "quiet", 3 * time.Second, true},
		{false, "never-seen", 3 * time.Second, true},
		{true, "busy", 3 * time.Second, true},
		{true, "quiet", 62 * time.Second, true},
		{true, "never-seen", 0, false},
	} {
		s.SetWatchPerNamespace(tc.perNamespace)
		got, known := s.StalenessIn(tc.namespace)
		if got != tc.want || known != tc.known {
			t.Errorf("per namespace %v, %s: staleness %v %v, want %v %v", tc.perNamespace, tc.namespace, got, known, tc.want, tc.known)
		}
	}
}

// The feeder records when each state it is handed was written: the newest write's time, which
// the cache keeps in CreationTimestamp (stripWorkflow); a live read's observation takes it from
// the managed fields.
func TestObservationsCarryTheirWriteTime(t *testing.T) {
	s, _ := newTestStore(t)
	f := &feeder{store: s, metrics: newStoreMetrics(s)}
	written := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	f.observe(&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wf", UID: "a", ResourceVersion: "7",
		CreationTimestamp: metav1.Time{Time: written}, Labels: phaseLabels[argo.PhaseRunning]}}, false)
	if r, _ := s.Get("a"); !r.WrittenAt.Equal(written) {
		t.Errorf("from the watch: written at %v, want %v", r.WrittenAt, written)
	}
	wf := &argo.Workflow{ObjectMeta: metav1.ObjectMeta{UID: "b", ResourceVersion: "8", ManagedFields: []metav1.ManagedFieldsEntry{
		{Time: &metav1.Time{Time: written.Add(-time.Minute)}}, {Time: &metav1.Time{Time: written}}}}}
	if got := ObservationOf(wf, false).WrittenAt; !got.Equal(written) {
		t.Errorf("from a live read: written at %v, want %v", got, written)
	}
}
