package completionstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// CacheByObject configures the manager's cache for Workflows: metadata only (the API server
// sends neither spec nor status, so a workflow's size costs the watch nothing), the namespaces
// to watch (all when empty), and a transform that keeps only what the store needs. The phase
// comes from the labels Argo writes with it (argo.PhaseFromLabels): a cached workflow costs a
// few hundred bytes however large the object is.
func CacheByObject(namespaces []string) (obj client.Object, byObject cache.ByObject) {
	byObject.Transform = stripWorkflow
	if len(namespaces) > 0 {
		byObject.Namespaces = make(map[string]cache.Config, len(namespaces))
		for _, ns := range namespaces {
			byObject.Namespaces[ns] = cache.Config{}
		}
	}
	return workflowMetadata(), byObject
}

// workflowMetadata is the object the cache's Workflow informer is asked for by.
func workflowMetadata() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(argo.WorkflowGVK)
	return m
}

// stripWorkflow is the cache transform of CacheByObject: it keeps the identity, the
// resourceVersion, the deletion mark, and labels that tell the same phase as the workflow's
// (argo.PhaseFromLabels). Those labels are one of a few maps shared by every cached workflow of
// that phase (a map per workflow would be a third of what the cache holds of it): nothing may
// write to a cached workflow's labels.
func stripWorkflow(obj any) (any, error) {
	wf, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	out := &metav1.PartialObjectMetadata{
		TypeMeta: wf.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         wf.Namespace,
			Name:              wf.Name,
			UID:               wf.UID,
			ResourceVersion:   wf.ResourceVersion,
			DeletionTimestamp: wf.DeletionTimestamp,
			Labels:            phaseLabels[argo.PhaseFromLabels(wf.Labels)],
		},
	}
	// The time of the newest write (the feeder's lag sample) rides in CreationTimestamp, a
	// field every cached object has anyway: the cache keeps no managed fields, and nothing of
	// the guard reads a cached workflow's creation time.
	out.CreationTimestamp = metav1.Time{Time: lastWrite(wf)}
	return out, nil
}

// lastWrite is the time of the newest write to wf that its managed fields record (to the
// second), or the zero time.
func lastWrite(wf metav1.Object) time.Time {
	var newest time.Time
	for _, e := range wf.GetManagedFields() {
		if e.Time != nil && e.Time.After(newest) {
			newest = e.Time.Time
		}
	}
	return newest
}

// phaseLabels holds, for each phase the labels can settle, the labels Argo writes with it; an
// unsettled phase has none (nil).
var phaseLabels = func() map[argo.Phase]map[string]string {
	m := map[argo.Phase]map[string]string{}
	for _, p := range []argo.Phase{argo.PhasePending, argo.PhaseRunning, argo.PhaseSucceeded, argo.PhaseFailed, argo.PhaseError} {
		m[p] = map[string]string{argo.LabelPhase: string(p), argo.LabelCompleted: strconv.FormatBool(p.Terminal())}
	}
	return m
}()

// WatchOptions configures Watch.
type WatchOptions struct {
	// Registerer receives the store's metrics (default controller-runtime's registry, served
	// on the manager's metrics endpoint).
	Registerer prometheus.Registerer
}

// The guard lists and watches Workflows for its store; nothing else of Argo's.
// +kubebuilder:rbac:groups=argoproj.io,resources=workflows,verbs=get;list;watch

// Watch feeds store from the manager's Workflow informer and runs the store's sweeper in the
// manager. The manager's scheme must know argo.Workflow (argo.AddToScheme), and its cache
// should be configured with CacheByObject. The returned checker passes once the informer has
// synced: until then the store may lack completions that happened before the guard started.
func Watch(ctx context.Context, mgr manager.Manager, store *Store, opts WatchOptions) (healthz.Checker, error) {
	if store == nil {
		return nil, errors.New("completionstore: Watch needs a store")
	}
	if !mgr.GetScheme().Recognizes(argo.WorkflowGVK) {
		return nil, errors.New("completionstore: the manager's scheme does not know argo.Workflow; call argo.AddToScheme")
	}
	reg := opts.Registerer
	if reg == nil {
		reg = metrics.Registry
	}
	m := newStoreMetrics(store)
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("completionstore: registering metrics: %w", err)
	}
	// The cache is not started yet: ask for the informer without waiting for it to sync.
	inf, err := mgr.GetCache().GetInformer(ctx, workflowMetadata(), cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("completionstore: getting the Workflow informer: %w", err)
	}
	h := &feeder{store: store, metrics: m, clock: store.clock}
	// A watch per namespace (an informer over several namespaces, which does not say how far
	// its watches got): each one's lag is its own (Store.StalenessIn). Set before the first
	// event.
	if _, ok := inf.(resourceVersioner); !ok {
		store.SetWatchPerNamespace(true)
	}
	// The registration, for the handler to ask whether the initial list is done: set once
	// AddEventHandler returns, while events may already be coming.
	var registered atomic.Pointer[toolscache.ResourceEventHandlerRegistration]
	handle, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			h.observe(obj, false)
			if r := registered.Load(); r != nil && (*r).HasSynced() {
				// A workflow created now; not one of the initial list.
				h.sampleLag(obj)
			}
		},
		UpdateFunc: func(old, obj any) {
			h.observe(obj, false)
			h.completed(old, obj)
			if o, ok := old.(metav1.Object); ok && o.GetResourceVersion() != obj.(metav1.Object).GetResourceVersion() {
				// A change (a resync repeats the same object, written long ago).
				h.sampleLag(obj)
			}
		},
		DeleteFunc: func(obj any) { h.observe(obj, true) },
	})
	if err != nil {
		return nil, fmt.Errorf("completionstore: watching Workflows: %w", err)
	}
	registered.Store(&handle)
	if err := mgr.Add(store); err != nil {
		return nil, fmt.Errorf("completionstore: adding the sweeper: %w", err)
	}
	store.informer = func(ctx context.Context, namespace, name string) (Observation, bool) {
		// From the informer's own cache, never the API server; not before it has synced
		// (the guard is not ready then), and never waiting for it.
		if !handle.HasSynced() {
			return Observation{}, false
		}
		ctx, cancel := context.WithTimeout(ctx, informerLookupTimeout)
		defer cancel()
		wf := workflowMetadata()
		if err := mgr.GetCache().Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, wf); err != nil {
			return Observation{}, false
		}
		o := ObservationOfMetadata(wf, false)
		// As the feeder does: without its write's time, a recalled running state would look
		// written before any refusal, and overturn it (a false RefusalOverturned).
		o.WrittenAt = wf.CreationTimestamp.Time
		return o, true
	}
	if rv, ok := inf.(resourceVersioner); ok {
		if err := mgr.Add(&progressPoller{store: store, informer: rv, interval: progressPollInterval}); err != nil {
			return nil, fmt.Errorf("completionstore: adding the watch progress poller: %w", err)
		}
	} else {
		// controller-runtime's informer over several namespaces (--namespaces) does not say
		// how far its watches got: only events move the progress, and a quiet watch looks
		// stale after WatchStaleAfter (store-first decisions then read live).
		mgr.GetLogger().Info("the Workflow informer does not report bookmarks: watch progress counts events only")
	}
	// Ready once synced, and ready after that however the watch fares. A stalled watch is
	// most often the API server's doing and stalls every replica at once: were they all to
	// go unready, the Service would lose its endpoints and the API server would admit every
	// pod unasked (failurePolicy Ignore), while a ready guard still decides exit handlers
	// with live reads. A stale watch shows in the metrics instead, and store-first decisions
	// then make the live read (see Store.WatchFresh).
	return func(*http.Request) error {
		// The handler's own HasSynced: true once every object of the initial list has been
		// delivered to the store, not only to the informer's cache.
		if !handle.HasSynced() {
			return errors.New("the Workflow watch has not synced yet")
		}
		return nil
	}, nil
}

// informerLookupTimeout bounds Recall's read of the informer's cache (an index lookup once
// the informer has synced).
const informerLookupTimeout = 100 * time.Millisecond

// progressPollInterval is how often the informer's resourceVersion is read: bookmarks move it
// without an event, and only the informer sees them.
const progressPollInterval = time.Second

// resourceVersioner is the part of client-go's SharedIndexInformer that says how far its watch
// has got, bookmarks included.
type resourceVersioner interface {
	LastSyncResourceVersion() string
}

// progressPoller feeds the informer's resourceVersion to the store's watch progress.
type progressPoller struct {
	store    *Store
	informer resourceVersioner
	interval time.Duration
}

// Start polls until ctx is done.
func (p *progressPoller) Start(ctx context.Context) error {
	every(ctx, p.store.clock, p.interval, func() { p.store.Progress(p.informer.LastSyncResourceVersion()) })
	return nil
}

// NeedLeaderElection is false: every replica watches for itself.
func (p *progressPoller) NeedLeaderElection() bool { return false }

// feeder turns informer events into store observations.
type feeder struct {
	store   *Store
	metrics *storeMetrics
	clock   clock.PassiveClock
}

// sampleLag tells the store how long after its write the change in obj reached it.
func (f *feeder) sampleLag(obj any) {
	wf, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	// Cached workflows carry their newest write's time in CreationTimestamp (stripWorkflow).
	if t := wf.CreationTimestamp.Time; !t.IsZero() {
		f.store.NoteLagIn(wf.Namespace, f.clock.Since(t))
	}
}

func (f *feeder) observe(obj any, deleted bool) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
		deleted = true
	}
	wf, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		f.metrics.observations.WithLabelValues("invalid").Inc()
		return
	}
	o := ObservationOfMetadata(wf, deleted)
	// Cached workflows carry their newest write's time in CreationTimestamp (stripWorkflow).
	o.WrittenAt = wf.CreationTimestamp.Time
	r := f.store.Observe(o)
	f.metrics.observations.WithLabelValues(r.String()).Inc()
	if r != Invalid {
		f.store.ProgressIn(wf.Namespace, wf.ResourceVersion)
	}
}

// completed counts an update that takes a workflow from a phase that is not terminal to one
// that is (as its labels tell): the moment its exit handler runs. A workflow listed complete
// when the watch starts is not counted.
func (f *feeder) completed(oldObj, obj any) {
	before, ok1 := oldObj.(*metav1.PartialObjectMetadata)
	after, ok2 := obj.(*metav1.PartialObjectMetadata)
	if !ok1 || !ok2 {
		return
	}
	if p := argo.PhaseFromLabels(before.Labels); p != argo.PhaseUnsettled && !p.Terminal() && argo.PhaseFromLabels(after.Labels).Terminal() {
		f.metrics.completions.Inc()
	}
}
