package webhook

import (
	"context"
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
	kind            objectKind
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
			Help: "Workflows for which the guard refused a write from its store alone (its live read had failed) and then saw the workflow running at that resourceVersion or a newer one: a real exit handler (or hook, or task) was probably refused, and waited until Argo's controller tried again (kind Pod or WorkflowTaskSet), or a real failure Event was refused, which Argo does not send again (kind Event); by kind of the object refused."}, []string{"kind"}),
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
		e.resourceVersion, e.phase = d.resourceVersion, d.phase
	}
	e.kind, e.what, e.last = f.object.spec().kind, f.object.eventRefused(), now
	e.refusals++
	if e.since.IsZero() {
		e.since = now
	}
}

// refusingFor says how long the store has refused the workflow of uid on its own, with no live
// read answering since (Options.StoreRefusalsFor bounds it); false when it is not refusing it.
func (o *overturns) refusingFor(uid types.UID) (time.Duration, bool) {
	if o.size.Load() == 0 {
		return 0, false
	}
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.entries[uid]
	if e == nil || e.since.IsZero() || now.Sub(e.kept()) > overturnWindow {
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
// Warning Event on the workflow.
func (g *guard) reportOverturn(ctx context.Context, uid types.UID, e *storeRefusal, rv string, phase argo.Phase) {
	waited := g.overturns.now().Sub(e.first)
	g.overturns.counter.WithLabelValues(string(e.kind)).Inc()
	logf.FromContext(ctx).Error(nil, "refusal overturned: the guard refused a write of this workflow from its store alone, and now sees it running",
		"workflow", e.namespace+"/"+e.name, "workflowUID", uid, "kind", e.kind, "refusals", e.refusals,
		"refusedAt", e.first, "refusedPhase", e.phase, "refusedResourceVersion", e.resourceVersion,
		"phase", phase, "resourceVersion", rv, "waited", waited.Round(time.Millisecond).String())
	if g.recorder == nil {
		return
	}
	regarding := &argo.Workflow{
		TypeMeta:   metav1.TypeMeta{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: e.name, UID: uid},
	}
	next := "Argo's controller tries the write again on its next pass"
	if e.kind == kindEvent {
		// client-go's recorder drops a refused Event and never sends it again.
		next = "Argo's recorder does not send a refused Event again: that failure Event is lost"
	}
	g.recorder.Eventf(regarding, nil, corev1.EventTypeWarning, contract.EventReasonRefusalOverturned, "Admit",
		"%s %d time(s) from the guard's store alone (%s at resourceVersion %s); the workflow is %s at resourceVersion %s: "+
			"the refusal was probably wrong; %s (%s since the first refusal)",
		e.what, e.refusals, e.phase, e.resourceVersion, phase, rv, next, waited.Round(time.Second))
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
		g.reportOverturn(ctx, o.UID, e, o.ResourceVersion, o.Phase)
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
	for _, uid := range uids {
		rec, ok := g.store.Get(uid)
		if !ok || rec.Deleted {
			continue
		}
		if e, ok := g.overturns.seen(uid, rec.ResourceVersion, rec.Phase, rec.WrittenAt); ok {
			g.reportOverturn(ctx, uid, e, rec.ResourceVersion, rec.Phase)
		}
	}
	g.overturns.sweep()
}
