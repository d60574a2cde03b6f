// Package completionstore remembers what exit-guard has seen of each Argo Workflow: its last
// phase, at which resourceVersion, and whether it was deleted. Records are keyed by UID, never
// by name (names are reused; upstream's first fix failed on exactly that), ordered by
// resourceVersion so that an older event never overwrites a newer one, and forgotten a TTL
// after their last change.
//
// Reads are lock-shared and allocation-free: admission requests come in parallel.
package completionstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/utils/clock"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// DefaultOptions are the store's defaults, the only place they are written (the command line
// binds its flags into a copy of them; New fills zero fields from them).
func DefaultOptions() Options {
	return Options{
		// Upstream's own fix (argo-workflows #16357) keeps completed workflows 10 minutes.
		TTL: 10 * time.Minute,
		// Bounds how long an expired record occupies memory; reads ignore expired records
		// whatever the sweeper's pace.
		SweepInterval: 30 * time.Second,
		// A healthy watch advances at least once a minute even when no workflow changes, as
		// the API server sends a bookmark about every minute; three missed bookmarks mean it
		// has stopped.
		WatchStaleAfter: 3 * time.Minute,
	}
}

// Options configures a Store. Zero values take DefaultOptions'.
type Options struct {
	// TTL is how long a record is kept after its last change.
	TTL time.Duration
	// SweepInterval is how often the sweeper removes expired records.
	SweepInterval time.Duration
	// WatchStaleAfter is how long the watch may go without advancing before WatchFresh says it
	// is stale.
	WatchStaleAfter time.Duration
	// Clock tells the time (default the real clock).
	Clock clock.WithTicker
}

// Observation is one state of a workflow, as a watch event or a live read reported it.
type Observation struct {
	UID             types.UID
	Namespace       string
	Name            string
	ResourceVersion string
	// Phase is status.phase, or argo.PhaseUnsettled when the workflow was seen without its
	// status and its labels did not tell.
	Phase argo.Phase
	// Deleted is true when the workflow is gone.
	Deleted bool
	// WrittenAt is when this state was written, to the second, as the object's managed
	// fields tell (the API server's clock); zero when unknown.
	WrittenAt time.Time
}

// ObservationOf is the observation a workflow object makes.
func ObservationOf(wf *argo.Workflow, deleted bool) Observation {
	return Observation{
		UID:             wf.UID,
		Namespace:       wf.Namespace,
		Name:            wf.Name,
		ResourceVersion: wf.ResourceVersion,
		Phase:           wf.Status.Phase,
		Deleted:         deleted,
		WrittenAt:       lastWrite(wf),
	}
}

// ObservationOfMetadata is the observation a workflow read without its status makes: its
// phase is what its labels tell (argo.PhaseFromLabels), argo.PhaseUnsettled when they do not.
func ObservationOfMetadata(wf metav1.Object, deleted bool) Observation {
	return Observation{
		UID:             wf.GetUID(),
		Namespace:       wf.GetNamespace(),
		Name:            wf.GetName(),
		ResourceVersion: wf.GetResourceVersion(),
		Phase:           argo.PhaseFromLabels(wf.GetLabels()),
		Deleted:         deleted,
	}
}

// Record is what the store knows of one workflow: the newest observation of its UID (for a
// tombstone, Phase is the phase last seen before the deletion) and when it was recorded.
type Record struct {
	Observation
	// SeenAt is when this state was recorded.
	SeenAt time.Time
}

// Result says what Observe did with an observation.
type Result int

// Results of Observe.
const (
	// Applied: the observation is newer than what the store had, or the first of its UID.
	Applied Result = iota
	// Stale: the store already holds this or a newer resourceVersion of the UID.
	Stale
	// Invalid: no UID, or a resourceVersion that cannot be ordered.
	Invalid
)

// Store holds one Record per workflow UID.
type Store struct {
	ttl           time.Duration
	sweepInterval time.Duration
	clock         clock.WithTicker

	watchStaleAfter time.Duration

	// informer reads what the Workflow informer holds of a workflow (set by Watch): Recall
	// asks it when the store has forgotten a workflow.
	informer func(ctx context.Context, namespace, name string) (Observation, bool)

	// listeners are called with every observation Observe can order (OnObserve).
	listeners atomic.Pointer[[]func(Observation)]

	mu      sync.RWMutex
	records map[types.UID]Record
	// The newest resourceVersion the watch has reached, and when it got there.
	progressRV string
	progressAt time.Time
	// The watch's latest lag sample: how long after its write a workflow's change reached the
	// store, and when that sample was taken.
	lag   time.Duration
	lagAt time.Time
	// perNamespace: the store is fed by a watch per namespace (SetWatchPerNamespace), and
	// nsLag holds each namespace's latest sample: one namespace's watch being current says
	// nothing of another's.
	perNamespace bool
	nsLag        map[string]lagSample
	// nsProgress holds, with a watch per namespace, how far each namespace's watch got and
	// when (events only: such an informer reports no bookmarks), so that one busy namespace
	// does not make a stuck namespace's watch look fresh (WatchFreshIn). One entry a watched
	// namespace.
	nsProgress map[string]progressMark
}

// progressMark is how far one watch got, and when.
type progressMark struct {
	rv string
	at time.Time
}

// lagSample is a lag sample and when it was taken.
type lagSample struct {
	lag time.Duration
	at  time.Time
}

// New returns an empty Store.
func New(opts Options) (*Store, error) {
	def := DefaultOptions()
	if opts.TTL < 0 {
		return nil, fmt.Errorf("completionstore: TTL must not be negative, got %s", opts.TTL)
	}
	if opts.WatchStaleAfter < 0 {
		return nil, fmt.Errorf("completionstore: WatchStaleAfter must not be negative, got %s", opts.WatchStaleAfter)
	}
	if opts.WatchStaleAfter == 0 {
		opts.WatchStaleAfter = def.WatchStaleAfter
	}
	if opts.SweepInterval < 0 {
		return nil, fmt.Errorf("completionstore: SweepInterval must not be negative, got %s", opts.SweepInterval)
	}
	if opts.TTL == 0 {
		opts.TTL = def.TTL
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = def.SweepInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Store{
		ttl:             opts.TTL,
		sweepInterval:   opts.SweepInterval,
		clock:           opts.Clock,
		watchStaleAfter: opts.WatchStaleAfter,
		records:         make(map[types.UID]Record),
	}, nil
}

// TTL is how long records are kept after their last change.
func (s *Store) TTL() time.Duration { return s.ttl }

// Observe records o unless the store holds a newer state of the same UID. A deletion of a
// known UID always wins, whatever its resourceVersion: the informer reports a deletion it
// missed (DeletedFinalStateUnknown) with the last object it had, which can be older than what
// a live read has since recorded. The tombstone keeps the newest resourceVersion and phase
// known. A tombstone is never undone: UIDs are not reused.
func (s *Store) Observe(o Observation) Result {
	r, recorded := s.observe(o)
	if r != Invalid {
		if ls := s.listeners.Load(); ls != nil {
			for _, l := range *ls {
				l(recorded)
			}
		}
	}
	return r
}

// OnObserve adds fn to the functions Observe calls with each observation it can order, whether
// it applies it (as recorded: a tombstone keeps the newest state known) or holds a newer state
// already (as given), after it is recorded and outside the store's lock. The watch, live reads
// and Recall observe from their own goroutines, so fn may see observations of one workflow out
// of resourceVersion order (those of the watch alone come in order) and must compare
// resourceVersions itself. fn must be quick: the Workflow watch waits for it.
func (s *Store) OnObserve(fn func(Observation)) {
	for {
		old := s.listeners.Load()
		var ls []func(Observation)
		if old != nil {
			ls = append(ls, *old...)
		}
		ls = append(ls, fn)
		if s.listeners.CompareAndSwap(old, &ls) {
			return
		}
	}
}

// observe is Observe without the listeners; it returns the observation as recorded (as given
// when it is not applied).
func (s *Store) observe(o Observation) (Result, Observation) {
	if o.UID == "" {
		return Invalid, o
	}
	if _, err := resourceversion.CompareResourceVersion(o.ResourceVersion, o.ResourceVersion); err != nil {
		return Invalid, o
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.records[o.UID]
	if ok && !s.expired(old, now) {
		cmp, err := resourceversion.CompareResourceVersion(o.ResourceVersion, old.ResourceVersion)
		if err != nil {
			return Invalid, o
		}
		switch {
		case old.Deleted:
			return Stale, o
		case o.Deleted && cmp <= 0:
			// The deletion, reported with an older (or the same) copy: the newer state's
			// resourceVersion and phase stay, as a tombstone.
			o.ResourceVersion, o.Phase = old.ResourceVersion, old.Phase
		case cmp < 0:
			return Stale, o
		case cmp == 0 && !o.Deleted && (old.Phase != argo.PhaseUnsettled || o.Phase == argo.PhaseUnsettled):
			// The same state again; news only when it tells the phase the store could not
			// (the watch saw the workflow without its status, a live read with it).
			return Stale, o
		}
		if o.Deleted && (o.Phase == argo.PhaseUnknown || o.Phase == argo.PhaseUnsettled) {
			o.Phase = old.Phase
		}
	}
	s.records[o.UID] = Record{Observation: o, SeenAt: now}
	return Applied, o
}

// Progress records that the watch has reached resourceVersion rv (an event or a bookmark),
// if it is newer than any it reached before, and says whether it was.
func (s *Store) Progress(rv string) bool {
	if rv == "" {
		return false
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.progressRV != "" {
		if cmp, err := resourceversion.CompareResourceVersion(rv, s.progressRV); err != nil || cmp <= 0 {
			return false
		}
	} else if _, err := resourceversion.CompareResourceVersion(rv, rv); err != nil {
		return false
	}
	s.progressRV, s.progressAt = rv, now
	return true
}

// ProgressIn is Progress for an event of a workflow in namespace: with a watch per namespace it
// also moves that namespace's own progress (WatchFreshIn). It says whether the store's progress
// advanced.
func (s *Store) ProgressIn(namespace, rv string) bool {
	advanced := s.Progress(rv)
	if rv == "" {
		return advanced
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.perNamespace {
		return advanced
	}
	if mark, ok := s.nsProgress[namespace]; ok {
		if cmp, err := resourceversion.CompareResourceVersion(rv, mark.rv); err != nil || cmp <= 0 {
			return advanced
		}
	} else if _, err := resourceversion.CompareResourceVersion(rv, rv); err != nil {
		return advanced
	}
	if s.nsProgress == nil {
		s.nsProgress = map[string]progressMark{}
	}
	s.nsProgress[namespace] = progressMark{rv: rv, at: now}
	return advanced
}

// WatchFreshIn is WatchFresh for the workflows of namespace: with a watch per namespace, whether
// that namespace's own watch has advanced within WatchStaleAfter (never, for a namespace whose
// watch has delivered nothing); otherwise whether the one watch has.
func (s *Store) WatchFreshIn(namespace string) bool {
	s.mu.RLock()
	per, mark := s.perNamespace, s.nsProgress[namespace]
	s.mu.RUnlock()
	if !per {
		return s.WatchFresh()
	}
	return !mark.at.IsZero() && s.clock.Since(mark.at) < s.watchStaleAfter
}

// LastProgress returns the newest resourceVersion the watch has reached and when; a zero time
// when it has reached none.
func (s *Store) LastProgress() (rv string, at time.Time) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.progressRV, s.progressAt
}

// WatchFresh says whether the watch has advanced within WatchStaleAfter. When it has not, the
// store may lack any change since: completions, retries, deletions.
func (s *Store) WatchFresh() bool {
	_, at := s.LastProgress()
	return !at.IsZero() && s.clock.Since(at) < s.watchStaleAfter
}

// NoteLag records that a change written lag ago has just reached the store through the watch:
// a sample of how far behind the API server the store is.
func (s *Store) NoteLag(lag time.Duration) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lag, s.lagAt = max(lag, 0), now
}

// NoteLagIn is NoteLag for a change of a workflow in namespace: with a watch per namespace,
// the sample tells how far behind that namespace's watch is, and no other's.
func (s *Store) NoteLagIn(namespace string, lag time.Duration) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lag, s.lagAt = max(lag, 0), now
	if !s.perNamespace {
		// One watch: the sample above says it all, and no map grows with every namespace.
		return
	}
	if s.nsLag == nil {
		s.nsLag = map[string]lagSample{}
	}
	s.nsLag[namespace] = lagSample{max(lag, 0), now}
}

// SetWatchPerNamespace says that the store is fed by a watch per namespace (an informer over
// several namespaces), so that StalenessIn counts each namespace's own samples.
func (s *Store) SetWatchPerNamespace(perNamespace bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.perNamespace = perNamespace
}

// LastLag returns the latest lag sample and when it was taken (a zero time when none was).
func (s *Store) LastLag() (lag time.Duration, at time.Time) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lag, s.lagAt
}

// Staleness is how old the newest write the store is known to have received is: the latest
// lag sample plus the time since it was taken; false when no sample was ever taken. Changes
// arrive in order, so every change the store lacks was written less than that long ago.
func (s *Store) Staleness() (time.Duration, bool) {
	lag, at := s.LastLag()
	if at.IsZero() {
		return 0, false
	}
	return lag + s.clock.Since(at), true
}

// StalenessIn is Staleness for the workflows of namespace: with a watch per namespace, from
// that namespace's own samples alone (false when it has none); otherwise from the one watch's.
func (s *Store) StalenessIn(namespace string) (time.Duration, bool) {
	s.mu.RLock()
	per, sample := s.perNamespace, s.nsLag[namespace]
	s.mu.RUnlock()
	if !per {
		return s.Staleness()
	}
	if sample.at.IsZero() {
		return 0, false
	}
	return sample.lag + s.clock.Since(sample.at), true
}

// Get returns the record of uid, if the store holds one that has not expired.
func (s *Store) Get(uid types.UID) (Record, bool) {
	s.mu.RLock()
	r, ok := s.records[uid]
	s.mu.RUnlock()
	if !ok || s.expired(r, s.clock.Now()) {
		return Record{}, false
	}
	return r, true
}

// Recall is Get, and, when the store holds nothing of uid, what the Workflow informer holds of
// the workflow namespace/name with that UID (when Watch feeds the store), recorded as if the
// watch had just delivered it. The store forgets a workflow a TTL after its last change; the
// informer keeps every workflow that exists: a completion older than the TTL is still a
// completion. A workflow the informer does not hold either is not recalled.
func (s *Store) Recall(ctx context.Context, uid types.UID, namespace, name string) (Record, bool) {
	if r, ok := s.Get(uid); ok || s.informer == nil {
		return r, ok
	}
	o, ok := s.informer(ctx, namespace, name)
	if !ok || o.UID != uid {
		return Record{}, false
	}
	s.Observe(o)
	return s.Get(uid)
}

// Len is the number of records held, expired ones not yet swept included.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.records)
}

// Counts returns how many records are terminal, deleted, and neither.
func (s *Store) Counts() (terminal, deleted, active int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, r := range s.records {
		switch {
		case r.Deleted:
			deleted++
		case r.Phase.Terminal():
			terminal++
		default:
			active++
		}
	}
	return terminal, deleted, active
}

// Sweep removes expired records and returns how many it removed.
func (s *Store) Sweep() int {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for uid, r := range s.records {
		if s.expired(r, now) {
			delete(s.records, uid)
			n++
		}
	}
	return n
}

func (s *Store) expired(r Record, now time.Time) bool {
	return now.Sub(r.SeenAt) >= s.ttl
}

// Start runs the sweeper until ctx is done. It makes Store a manager.Runnable.
func (s *Store) Start(ctx context.Context) error {
	every(ctx, s.clock, s.sweepInterval, func() { s.Sweep() })
	return nil
}

// every runs f every interval of clk until ctx is done.
func every(ctx context.Context, clk clock.WithTicker, interval time.Duration, f func()) {
	t := clk.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			f()
		}
	}
}

// NeedLeaderElection is false: every replica keeps and sweeps its own store.
func (s *Store) NeedLeaderElection() bool { return false }
