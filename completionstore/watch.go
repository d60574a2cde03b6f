package completionstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// CacheByObject configures the manager's cache for Workflows: the namespaces to watch (all when
// empty) and a transform that keeps only what the store needs. The type argo.Workflow already
// decodes nothing of spec and status but the phase; the transform drops the rest of the
// metadata (labels, annotations, managed fields, owner references), so a cached workflow costs
// a few hundred bytes however large the object is.
func CacheByObject(namespaces []string) (obj *argo.Workflow, byObject cache.ByObject) {
	byObject.Transform = stripWorkflow
	if len(namespaces) > 0 {
		byObject.Namespaces = make(map[string]cache.Config, len(namespaces))
		for _, ns := range namespaces {
			byObject.Namespaces[ns] = cache.Config{}
		}
	}
	return &argo.Workflow{}, byObject
}

// stripWorkflow is the cache transform of CacheByObject.
func stripWorkflow(obj any) (any, error) {
	wf, ok := obj.(*argo.Workflow)
	if !ok {
		return obj, nil
	}
	return &argo.Workflow{
		TypeMeta: wf.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         wf.Namespace,
			Name:              wf.Name,
			UID:               wf.UID,
			ResourceVersion:   wf.ResourceVersion,
			DeletionTimestamp: wf.DeletionTimestamp,
		},
		Status: argo.WorkflowStatus{Phase: wf.Status.Phase},
	}, nil
}

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
	inf, err := mgr.GetCache().GetInformer(ctx, &argo.Workflow{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("completionstore: getting the Workflow informer: %w", err)
	}
	h := &feeder{store: store, metrics: m}
	handle, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { h.observe(obj, false) },
		UpdateFunc: func(_, obj any) { h.observe(obj, false) },
		DeleteFunc: func(obj any) { h.observe(obj, true) },
	})
	if err != nil {
		return nil, fmt.Errorf("completionstore: watching Workflows: %w", err)
	}
	if err := mgr.Add(store); err != nil {
		return nil, fmt.Errorf("completionstore: adding the sweeper: %w", err)
	}
	return func(*http.Request) error {
		// The handler's own HasSynced: true once every object of the initial list has been
		// delivered to the store, not only to the informer's cache.
		if !handle.HasSynced() {
			return errors.New("the Workflow watch has not synced yet")
		}
		return nil
	}, nil
}

// feeder turns informer events into store observations.
type feeder struct {
	store   *Store
	metrics *storeMetrics
}

func (f *feeder) observe(obj any, deleted bool) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
		deleted = true
	}
	wf, ok := obj.(*argo.Workflow)
	if !ok {
		f.metrics.observations.WithLabelValues("invalid").Inc()
		return
	}
	r := f.store.Observe(ObservationOf(wf, deleted))
	f.metrics.observations.WithLabelValues(r.String()).Inc()
}

// String names a Result, as in metrics.
func (r Result) String() string {
	switch r {
	case Applied:
		return "applied"
	case Stale:
		return "stale"
	default:
		return "invalid"
	}
}

// storeMetrics are the store's Prometheus metrics.
type storeMetrics struct {
	store        *Store
	records      *prometheus.Desc
	observations *prometheus.CounterVec
}

func newStoreMetrics(s *Store) *storeMetrics {
	return &storeMetrics{
		store: s,
		records: prometheus.NewDesc("exit_guard_store_records",
			"Workflow records held by the completion store, by state (terminal, deleted, active).",
			[]string{"state"}, nil),
		observations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "exit_guard_store_observations_total",
			Help: "Workflow states offered to the completion store, by result (applied, stale, invalid).",
		}, []string{"result"}),
	}
}

// Describe implements prometheus.Collector.
func (m *storeMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.records
	m.observations.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *storeMetrics) Collect(ch chan<- prometheus.Metric) {
	terminal, deleted, active := m.store.Counts()
	ch <- prometheus.MustNewConstMetric(m.records, prometheus.GaugeValue, float64(terminal), "terminal")
	ch <- prometheus.MustNewConstMetric(m.records, prometheus.GaugeValue, float64(deleted), "deleted")
	ch <- prometheus.MustNewConstMetric(m.records, prometheus.GaugeValue, float64(active), "active")
	m.observations.Collect(ch)
}
