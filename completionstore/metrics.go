package completionstore

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

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
	store         *Store
	records       *prometheus.Desc
	observations  *prometheus.CounterVec
	completions   prometheus.Counter
	watchRV       *prometheus.Desc
	watchProgress *prometheus.Desc
	watchLag      *prometheus.Desc
}

func newStoreMetrics(s *Store) *storeMetrics {
	return &storeMetrics{
		store: s,
		records: prometheus.NewDesc("exit_guard_store_records",
			"Workflow records held by the completion store, by state (terminal, deleted, active).",
			[]string{"state"}, nil),
		observations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exit_guard_store_observations_total",
			Help: "Workflow states offered to the completion store, by result (applied, stale, invalid)."}, []string{"result"}),
		completions: prometheus.NewCounter(prometheus.CounterOpts{Name: "exit_guard_workflow_completions_total",
			Help: "Workflows the watch saw go from a phase that is not terminal to one that is: the moments their exit handlers run. Compared with the admissions the guard receives, it shows a guard that is never called."}),
		watchRV: prometheus.NewDesc("exit_guard_watch_resource_version",
			"The newest resourceVersion the Workflow watch has reached (events and bookmarks), as a number.", nil, nil),
		watchProgress: prometheus.NewDesc("exit_guard_watch_last_progress_timestamp_seconds",
			"When the Workflow watch last advanced (an event or a bookmark; the API server sends one about every minute), in Unix seconds; 0 before it ever has.", nil, nil),
		watchLag: prometheus.NewDesc("exit_guard_watch_lag_seconds",
			"The Workflow watch's latest lag sample: how long after its write (its managed fields' time, to the second) a workflow's change reached the store.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *storeMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.records
	ch <- m.watchRV
	ch <- m.watchProgress
	ch <- m.watchLag
	m.observations.Describe(ch)
	m.completions.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *storeMetrics) Collect(ch chan<- prometheus.Metric) {
	terminal, deleted, active := m.store.Counts()
	ch <- prometheus.MustNewConstMetric(m.records, prometheus.GaugeValue, float64(terminal), "terminal")
	ch <- prometheus.MustNewConstMetric(m.records, prometheus.GaugeValue, float64(deleted), "deleted")
	ch <- prometheus.MustNewConstMetric(m.records, prometheus.GaugeValue, float64(active), "active")
	rv, at := m.store.LastProgress()
	// resourceVersions are opaque strings to clients, but etcd's are integers: shown as one
	// where it is, for graphs; 0 otherwise.
	n, _ := strconv.ParseUint(rv, 10, 64)
	ch <- prometheus.MustNewConstMetric(m.watchRV, prometheus.GaugeValue, float64(n))
	var ts float64
	if !at.IsZero() {
		ts = float64(at.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(m.watchProgress, prometheus.GaugeValue, ts)
	lag, _ := m.store.LastLag()
	ch <- prometheus.MustNewConstMetric(m.watchLag, prometheus.GaugeValue, lag.Seconds())
	m.observations.Collect(ch)
	m.completions.Collect(ch)
}
