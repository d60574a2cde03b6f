package webhook

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// overturnWindow is how long a refusal made from the store alone is remembered, to be checked
// against what the guard sees of its workflow next. Argo's controller tries a refused pod again
// every DEFAULT_REQUEUE_TIME (10 s by default), and the guard's watch delivers a retry within
// its lag, so a wrong refusal shows within seconds; the window is the store's default TTL, so
// that a guard whose watch lagged by minutes still notices.
const overturnWindow = 10 * time.Minute

// overturnSweepInterval is how often the remembered refusals are checked against the store: a
// few seconds, as Argo's controller tries a refused write again every 10 s by default.
const overturnSweepInterval = 5 * time.Second

// storeRunGap ends a run of refusals made from the store alone (the bound of
// Options.StoreRefusalsFor counts one run): Argo's controller sends a refused pod again every
// DEFAULT_REQUEUE_TIME (10 s by default), so a workflow refused again within three of those is
// the same stale pass, or a real exit handler waiting; one refused after a longer quiet gap is
// a new pass, which gets a bound of its own.
const storeRunGap = 30 * time.Second

// maxOverturnEntries bounds the refusals remembered: one entry per workflow, and a refusal
// from the store alone needs a failing live read, so thousands at once means an API server that
// is down, when the oldest are the least useful to keep.
const maxOverturnEntries = 4096

// storeRefusal is what the guard remembers of the refusals it made for one workflow from its
// store alone.
type storeRefusal struct {
	namespace, name string
	// resourceVersion and phase are the store's completion the refusals were decided on (the
	// newest, if several).
	resourceVersion string
	phase           argo.Phase
	// writtenAt is when that completion was written (zero: unknown); rerunChecked is the
	// newer completion last checked for a run in between (rerunSuspects).
	writtenAt    time.Time
	rerunChecked string
	kind         *kindSpec
	// what names the last object refused ("exit-handler pod p (node n) refused").
	what        string
	first, last time.Time
	refusals    int
	// since is when the store began refusing the workflow on its own with no live read
	// answering since (the bound of Options.StoreRefusalsFor); zero once one has. admittedAt
	// is the last admission past that bound, which keeps the entry as a refusal would.
	since, admittedAt time.Time
}

// kept is when the entry was last refused or admitted past the bound: it is forgotten
// overturnWindow later.
func (e *storeRefusal) kept() time.Time {
	if e.admittedAt.After(e.last) {
		return e.admittedAt
	}
	return e.last
}

// overturns remembers the refusals made from the store alone, by workflow UID, and tells when
// the guard sees such a workflow running at the refused resourceVersion or a newer one.
type overturns struct {
	now     func() time.Time
	counter *prometheus.CounterVec

	// size is len(entries), read without the lock: the common case, no refusal remembered,
	// costs each decision one atomic load.
	size atomic.Int64

	mu      sync.Mutex
	entries map[types.UID]*storeRefusal
}

func newOverturns(now func() time.Time) *overturns {
	return &overturns{
		now: now,
		counter: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exit_guard_refusals_overturned_total",
			Help: "Workflows for which the guard refused a write from its store alone (its live read had failed) and then saw the workflow running at that resourceVersion or a newer one (or, after a relist of its watch, completed again by a run that started before the last refusal): a real exit handler (or hook, or task) was probably refused, and waited until Argo's controller tried again, or a real failure Event was refused, which Argo does not send again (the Event says which); by kind of the object refused."}, []string{"kind"}),
		entries: map[types.UID]*storeRefusal{},
	}
}

// note remembers a refusal that d decided from the store alone. Only those can be wrong: a live
// read is never older than the newest write, so a refusal it decided was right when it was made.
func (o *overturns) note(f facts, d decision) {
	if !d.deny || d.source != sourceStore || d.phase == "" || !d.phase.Terminal() ||
		d.reason == contract.ReasonWorkflowDeleted || d.reason == contract.ReasonWorkflowReplaced || d.reason == contract.ReasonTaskSetOwnerGone {
		// Deletions (a UID never comes back) and live reads are not remembered.
		return
	}
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.entries[d.wfUID]
	if e != nil && now.Sub(e.kept()) > overturnWindow {
		// Past the window and not swept yet: a new run of refusals.
		e = nil
	}
	if e == nil {
		if len(o.entries) >= maxOverturnEntries {
			o.evictOldest()
		}
		e = &storeRefusal{namespace: d.wfNamespace, name: d.wfName, first: now}
		o.entries[d.wfUID] = e
		o.size.Store(int64(len(o.entries)))
	}
	if e.resourceVersion == "" || newerOrSame(d.resourceVersion, e.resourceVersion) {
		e.resourceVersion, e.phase, e.writtenAt = d.resourceVersion, d.phase, d.writtenAt
	}
	if e.since.IsZero() || now.Sub(e.kept()) > storeRunGap {
		// The first refusal of a run: none before it, a live answer since, or a quiet gap.
		e.since = now
	}
	e.kind, e.what, e.last = f.object.spec(), f.object.eventRefused(), now
	e.refusals++
}

// refusingFor says how long the store has refused the workflow of uid on its own, in one run
// (storeRunGap) with no live read answering since (Options.StoreRefusalsFor bounds it); false
// when it is not refusing it: none, a live answer since, or a quiet gap (the next refusal
// starts a new run).
func (o *overturns) refusingFor(uid types.UID) (time.Duration, bool) {
	if o.size.Load() == 0 {
		return 0, false
	}
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.entries[uid]
	if e == nil || e.since.IsZero() || now.Sub(e.kept()) > storeRunGap {
		return 0, false
	}
	return now.Sub(e.since), true
}

// admittedPastBound notes that the store, past Options.StoreRefusalsFor, admitted an object of
// the workflow of uid that it would have refused: the entry is kept (the store keeps admitting,
// and a later state can still overturn the refusals made).
func (o *overturns) admittedPastBound(uid types.UID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e := o.entries[uid]; e != nil {
		e.admittedAt = o.now()
	}
}

// answeredLive notes that a live read of the workflow of uid answered: the store's run of
// refusals on its own ends there (its refusals are checked as before), and its bound starts
// again with the next one.
func (o *overturns) answeredLive(uid types.UID) {
	if o.size.Load() == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if e := o.entries[uid]; e != nil {
		e.since = time.Time{}
	}
}

// evictOldest drops the entry refused (or admitted past the bound) longest ago; o.mu is held.
func (o *overturns) evictOldest() {
	var oldest types.UID
	var at time.Time
	for uid, e := range o.entries {
		if oldest == "" || e.kept().Before(at) {
			oldest, at = uid, e.kept()
		}
	}
	delete(o.entries, oldest)
	o.size.Store(int64(len(o.entries)))
}

// overturnWriteSlack is how much later than the last refusal a state may have been written and
// still overturn it: a write's time is the API server's clock to the second, the refusal's the
// guard's clock.
const overturnWriteSlack = 2 * time.Second

// seen checks what the guard now knows of workflow uid, at resourceVersion rv in phase, written
// at writtenAt (zero: unknown), against the refusals it remembers: when the workflow is running
// at the refused resourceVersion or a newer one, written before the last refusal (or at an
// unknown time), the refusals were overturned, and seen returns them (forgotten from then on).
// A running state written after the last refusal proves nothing: a retry that came after a
// right refusal writes only such states.
func (o *overturns) seen(uid types.UID, rv string, phase argo.Phase, writtenAt time.Time) (*storeRefusal, bool) {
	if uid == "" || rv == "" || phase.Terminal() || phase == argo.PhaseUnsettled || o.size.Load() == 0 {
		return nil, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	defer func() { o.size.Store(int64(len(o.entries))) }()
	e := o.entries[uid]
	switch {
	case e == nil:
		return nil, false
	case o.now().Sub(e.kept()) > overturnWindow:
		delete(o.entries, uid)
		return nil, false
	case !newerOrSame(rv, e.resourceVersion):
		return nil, false
	case !writtenAt.IsZero() && writtenAt.After(e.last.Add(overturnWriteSlack)):
		// Written after the refusals: no proof either way. A retry written before them shows
		// in the watch's states, which come in order; a later write (Argo's own, after the
		// refused pass, or a retry that came later) is not counted.
		return nil, false
	}
	delete(o.entries, uid)
	return e, true
}

// sweep forgets the refusals older than overturnWindow.
func (o *overturns) sweep() {
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for uid, e := range o.entries {
		if now.Sub(e.kept()) > overturnWindow {
			delete(o.entries, uid)
		}
	}
	o.size.Store(int64(len(o.entries)))
}

// newerOrSame says whether resourceVersion a is b or newer; false when they cannot be ordered.
func newerOrSame(a, b string) bool {
	c, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && c >= 0
}

// reportOverturn audits refusals that turned out wrong: a metric, an error log line and a
// Warning Event on the workflow. ranFrom is the start of the run the refusals fell in when only
// a read of the whole workflow showed it (checkRerun), zero when a running state did.
func (g *guard) reportOverturn(ctx context.Context, uid types.UID, e *storeRefusal, rv string, phase argo.Phase, ranFrom time.Time) {
	waited := g.overturns.now().Sub(e.first)
	g.overturns.counter.WithLabelValues(string(e.kind.kind)).Inc()
	msg, state := "refusal overturned: the guard refused a write of this workflow from its store alone, and now sees it running", string(phase)
	if !ranFrom.IsZero() {
		msg = "refusal overturned: the guard refused a write of this workflow from its store alone, and the workflow ran again from before the refusal (its running state was not seen: a relist)"
		state = fmt.Sprintf("%s again after a run that started at %s", phase, ranFrom.UTC().Format(time.RFC3339))
	}
	logf.FromContext(ctx).Error(nil, msg,
		"workflow", e.namespace+"/"+e.name, "workflowUID", uid, "kind", e.kind.kind, "refusals", e.refusals,
		"refusedAt", e.first, "refusedPhase", e.phase, "refusedResourceVersion", e.resourceVersion,
		"phase", phase, "resourceVersion", rv, "ranFrom", ranFrom, "waited", waited.Round(time.Millisecond).String())
	if g.recorder == nil {
		return
	}
	regarding := &argo.Workflow{
		TypeMeta:   metav1.TypeMeta{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: e.name, UID: uid},
	}
	next := "Argo's controller tries the write again on its next pass"
	if e.kind.afterOverturn != "" {
		next = e.kind.afterOverturn
	}
	g.recorder.Eventf(regarding, nil, corev1.EventTypeWarning, contract.EventReasonRefusalOverturned, "Admit",
		"%s %d time(s) from the guard's store alone (%s at resourceVersion %s); the workflow is %s at resourceVersion %s: "+
			"the refusal was probably wrong; %s (%s since the first refusal)",
		e.what, e.refusals, e.phase, e.resourceVersion, state, rv, next, waited.Round(time.Second))
}

// observedByStore checks each state the store records (its watch, in order, and live reads)
// against the refusals remembered: a retry that the watch delivers late is seen running even
// when the workflow has completed again by then.
func (g *guard) observedByStore(o completionstore.Observation) {
	if o.Deleted {
		return
	}
	if e, ok := g.overturns.seen(o.UID, o.ResourceVersion, o.Phase, o.WrittenAt); ok {
		ctx := logf.IntoContext(context.Background(), logf.Log.WithName("overturns"))
		g.reportOverturn(ctx, o.UID, e, o.ResourceVersion, o.Phase, time.Time{})
	}
}

// overturnSweeper checks, every interval, the remembered refusals against the store (a
// workflow whose refused write is not tried again still shows) and forgets the old ones. A
// manager.Runnable on every replica: each remembers its own refusals.
type overturnSweeper struct {
	g        *guard
	interval time.Duration
}

// Start runs the sweeper until ctx ends.
func (s *overturnSweeper) Start(ctx context.Context) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.g.sweepOverturns(ctx)
		}
	}
}

// NeedLeaderElection is false: every replica checks its own refusals.
func (*overturnSweeper) NeedLeaderElection() bool { return false }

// sweepOverturns checks every remembered refusal against the store, then forgets the old ones.
func (g *guard) sweepOverturns(ctx context.Context) {
	g.overturns.mu.Lock()
	uids := make([]types.UID, 0, len(g.overturns.entries))
	for uid := range g.overturns.entries {
		uids = append(uids, uid)
	}
	g.overturns.mu.Unlock()
	var reruns []rerunSuspect
	for _, uid := range uids {
		rec, ok := g.store.Get(uid)
		if !ok || rec.Deleted {
			continue
		}
		if e, ok := g.overturns.seen(uid, rec.ResourceVersion, rec.Phase, rec.WrittenAt); ok {
			g.reportOverturn(ctx, uid, e, rec.ResourceVersion, rec.Phase, time.Time{})
			continue
		}
		if len(reruns) == maxRerunChecksPerSweep {
			// The rest wait for the next sweep, unmarked.
			continue
		}
		if s, ok := g.overturns.rerunSuspect(uid, rec); ok {
			reruns = append(reruns, s)
		}
	}
	for _, s := range reruns {
		g.checkRerun(ctx, s)
	}
	g.overturns.sweep()
}

// A relist (the watch's resourceVersion expired: 410 Gone) delivers each workflow's newest
// state only. A retry that ran while the store refused its pods, and completed again before the
// watch relisted, then shows as a newer completion, its running state never seen: seen cannot
// count it. The sweep reads such a workflow whole, once per newer completion: `argo retry`
// sets status.startedAt anew, so a run that started after the refused completion was written,
// and before the last refusal, is a wrong refusal, counted as one.
const (
	// maxRerunChecksPerSweep bounds the reads of one sweep: a workflow each, and only those
	// refused from the store alone that completed again since.
	maxRerunChecksPerSweep = 8
	// rerunCheckTimeout bounds each read: the sweep runs beside the admission paths, never in
	// them, and a slow API server only delays the count.
	rerunCheckTimeout = 2 * time.Second
)

// rerunSuspect is a workflow refused from the store alone that has completed again since.
type rerunSuspect struct {
	uid             types.UID
	namespace, name string
	rv              string
}

// rerunSuspect says whether rec, the store's state of workflow uid, is a completion newer than
// the one its remembered refusals were decided on, not checked yet: the workflow may have run
// again in between, unseen. The check is noted as made, so each newer completion is read once.
func (o *overturns) rerunSuspect(uid types.UID, rec completionstore.Record) (rerunSuspect, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.entries[uid]
	if e == nil || o.now().Sub(e.kept()) > overturnWindow || !rec.Phase.Terminal() || e.writtenAt.IsZero() || rec.ResourceVersion == e.rerunChecked ||
		rec.ResourceVersion == e.resourceVersion || !newerOrSame(rec.ResourceVersion, e.resourceVersion) {
		return rerunSuspect{}, false
	}
	e.rerunChecked = rec.ResourceVersion
	return rerunSuspect{uid: uid, namespace: e.namespace, name: e.name, rv: rec.ResourceVersion}, true
}

// uncheck forgets that the completion at rv of workflow uid was checked: its read failed.
func (o *overturns) uncheck(uid types.UID, rv string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e := o.entries[uid]; e != nil && e.rerunChecked == rv {
		e.rerunChecked = ""
	}
}

// ranBetween says whether workflow uid, read whole as wf, started a run after its refused
// completion was written and before the last refusal (overturnWriteSlack allowed): its
// refusals were overturned, and ranBetween returns them (forgotten from then on).
func (o *overturns) ranBetween(uid types.UID, wf *argo.Workflow) (*storeRefusal, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	defer func() { o.size.Store(int64(len(o.entries))) }()
	e := o.entries[uid]
	started := wf.Status.StartedAt.Time
	if e == nil || o.now().Sub(e.kept()) > overturnWindow || wf.UID != uid || started.IsZero() || e.writtenAt.IsZero() ||
		!started.After(e.writtenAt) || started.After(e.last.Add(overturnWriteSlack)) {
		return nil, false
	}
	delete(o.entries, uid)
	return e, true
}

// checkRerun reads the workflow of s whole and counts its refusals overturned when it ran
// again while they were made. A failed read is tried again at the next sweep (logged at V(1)).
func (g *guard) checkRerun(ctx context.Context, s rerunSuspect) {
	rctx, cancel := context.WithTimeout(ctx, rerunCheckTimeout)
	defer cancel()
	wf, err := g.readWhole(rctx, s.namespace, s.name)
	if err != nil {
		logf.FromContext(ctx).V(1).Info("could not read a workflow that completed again after refusals from the store: checked again at the next sweep",
			"workflow", s.namespace+"/"+s.name, "resourceVersion", s.rv, "error", err.Error())
		g.overturns.uncheck(s.uid, s.rv)
		return
	}
	if e, ok := g.overturns.ranBetween(s.uid, wf); ok {
		g.reportOverturn(ctx, s.uid, e, wf.ResourceVersion, wf.Status.Phase, wf.Status.StartedAt.Time)
	}
}
