package webhook

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// guardMetrics are the webhook's Prometheus metrics.
type guardMetrics struct {
	decisions        *prometheus.CounterVec
	unexpected       *prometheus.CounterVec
	dryRuns          *prometheus.CounterVec
	liveRead         *prometheus.HistogramVec
	decisionTime     *prometheus.HistogramVec
	liveReadFailures *prometheus.CounterVec
	liveReadAttempts *prometheus.CounterVec
	panics           *prometheus.CounterVec
	staleFailures    *staleFailures
}

func newGuardMetrics() *guardMetrics {
	return &guardMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exit_guard_decisions_total",
			Help: "Admission decisions, by verdict (allowed, denied, warned, dry-run), reason, kind of object (Pod, WorkflowTaskSet, Event) and source: live-read (a read of the API server answered), store (the guard's store decided: no live read answered, or a store-first decision), request (the request alone decided: not owned, not covered, not watched)."}, []string{"verdict", "reason", "kind", "source"}),
		unexpected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exit_guard_unexpected_requester_decisions_total",
			Help: "Refusals (and, in warn and dry-run mode, would-be refusals) of requests sent for a user other than the expected workflow controller (--expected-requester), by verdict, reason and kind; they are not counted in exit_guard_decisions_total."}, []string{"verdict", "reason", "kind"}),
		dryRuns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exit_guard_dry_run_decisions_total",
			Help: "Decisions of dry-run requests (exit-guard check, helm test, kubectl --dry-run=server), which persist nothing, by verdict, reason and kind; they are not counted in exit_guard_decisions_total or exit_guard_unexpected_requester_decisions_total, so no alert or panel counts them."}, []string{"verdict", "reason", "kind"}),
		liveRead: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "exit_guard_live_read_duration_seconds",
			Help: "Latency of live reads of a pod's workflow, by result (found, not-found, timeout, error).",
			// From 1 ms to the 1 s default deadline and a little past it.
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}, []string{"result"}),
		decisionTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "exit_guard_decision_duration_seconds",
			Help: "How long the guard took to answer a request it decided, from its receipt to the answer, by role of the object (exit-handler, lifecycle-hook, step, agent, task-write, failure-claim): what a write of that role waits on the guard, the API server's own queueing apart. A role's read budget bounds it (--hook-step-read-budget, --live-read-budget).",
			// Around each budget (750 ms, 4 s) and up to the chart's timeoutSeconds (5 s) and past it.
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, .75, .8, .9, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.25, 4.5, 5, 7.5, 10}}, []string{"role"}),
		liveReadFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exit_guard_live_read_failures_total",
			Help: "Live reads that failed, ran out of time or were not made, so that the store decided (or, for row T6's read of the workflow that holds a reused name, the write stayed refused), by kind (timeout, error, shed: the decision found --max-concurrent-decisions in flight)."}, []string{"kind"}),
		liveReadAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exit_guard_live_read_retries_total",
			Help: "Further attempts within one live read, by cause: error (the last attempt failed; retried after a pause), hedged (the last attempt had not answered within --live-read-timeout; another started beside it), get-beside-list (a GET of the workflow started beside a LIST that had not answered within --live-read-get-after), shed (not started: the process had as many further attempts in flight as it allows, or the GETs beside slow LISTs had used their share of one LIST in 20)."}, []string{"cause"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exit_guard_panics_total",
			Help: "Panics the guard recovered, by where: admission (the request was answered HTTP 500, which the webhook's failurePolicy decides), live-read (a read that panicked after its decision had been made from another one), store-listener (the guard's check of a state its store was given, on the Workflow watch's goroutine: that state goes unchecked, the watch goes on). Each is a bug, logged with its stack."}, []string{"where"}),
		staleFailures: newStaleFailures(),
	}
}

// decisionSources are the values of exit_guard_decisions_total's source label (sourceLabel).
var decisionSources = []string{string(sourceLive), string(sourceStore), sourceRequest}

// sourceRequest is the source label of a decision the request alone made (rows 1 to 4 and
// their kinds' like): no workflow state was asked.
const sourceRequest = "request"

// sourceLabel is the source label of d.
func sourceLabel(d decision) string {
	if d.source == sourceNone {
		return sourceRequest
	}
	return string(d.source)
}

// initDecisions creates, at 0, the decision series that alerts count with increase(): for
// each kind, the refusals of mode and the admissions, only those its decisions can give. A series that first
// appeared at 1 would hide its first event from increase(), and that event is often the only
// one.
func (m *guardMetrics) initDecisions(mode Mode) {
	for _, k := range kinds {
		kind := k.kind
		for _, r := range k.refusals {
			for _, src := range decisionSources {
				m.decisions.WithLabelValues(denyVerdict(mode), string(r), string(kind), src)
			}
			m.unexpected.WithLabelValues(denyVerdict(mode), string(r), string(kind))
		}
		// Every admission series too: ExitGuardNeverCalled counts the pod webhook's admissions
		// with increase(), which would miss the first admission of a series that appeared at 1
		// (seen on the real Prometheus: the alert stayed firing after the guard was called).
		for _, r := range k.admissions {
			for _, src := range decisionSources {
				m.decisions.WithLabelValues(verdictAllowed, string(r), string(kind), src)
			}
		}
	}
}

func (m *guardMetrics) register(reg prometheus.Registerer) error {
	// The failure series exist from the start, at 0: a rate or an alert on them then reads 0
	// rather than nothing, and a dashboard shows a flat line rather than "no data".
	for _, kind := range []string{"timeout", "error", "shed"} {
		m.liveReadFailures.WithLabelValues(kind)
	}
	for _, cause := range []string{"error", "hedged", "shed", "get-beside-list"} {
		m.liveReadAttempts.WithLabelValues(cause)
	}
	for _, where := range []string{panicAdmission, panicLiveRead, panicStoreListener} {
		m.panics.WithLabelValues(where)
	}
	for _, c := range []prometheus.Collector{m.decisions, m.unexpected, m.dryRuns, m.liveRead, m.decisionTime, m.liveReadFailures, m.liveReadAttempts, m.panics, m.staleFailures} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// staleFailureSeriesTTL is how long a workflow's exit_guard_stale_failures_total series is
// exported after its last count. Argo's controller keeps a user metric's series until it
// restarts (or for its metricsTTL): a correction must outlive the alert windows that read it,
// and the series must not pile up.
const staleFailureSeriesTTL = 24 * time.Hour

// staleFailures counts, by workflow, the stale passes of Argo's controller that marked a
// Succeeded workflow failed in its memory, as the refused WorkflowFailed Events show them: the
// pass that records that Event is the one that counts the workflow's own user metrics (a
// counter with `when: "{{status}} != Succeeded"`), which no webhook can stop. It is a
// collector of its own, not a CounterVec, so that a workflow's series ends staleFailureSeriesTTL
// after its last count.
type staleFailures struct {
	desc *prometheus.Desc
	now  func() time.Time

	mu     sync.Mutex
	counts map[staleFailureKey]*staleFailureCount
}

type staleFailureKey struct{ namespace, workflow string }

type staleFailureCount struct {
	n    float64
	last time.Time
}

func newStaleFailures() *staleFailures {
	return &staleFailures{
		desc: prometheus.NewDesc("exit_guard_stale_failures_total",
			"Failure signals of stale workflow copies refused, by workflow: each is one pass of Argo's controller over a stale copy of a Succeeded workflow that marked it failed in its memory (a refused WorkflowFailed Event), where Argo counted the workflow's own user metrics. A workflow's series ends 24 hours after its last count.",
			[]string{"workflow_namespace", "workflow"}, nil),
		now:    time.Now,
		counts: map[staleFailureKey]*staleFailureCount{},
	}
}

func (s *staleFailures) inc(namespace, workflow string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := staleFailureKey{namespace, workflow}
	c := s.counts[k]
	if c == nil {
		c = &staleFailureCount{}
		s.counts[k] = c
	}
	c.n++
	c.last = s.now()
}

func (s *staleFailures) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

func (s *staleFailures) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for k, c := range s.counts {
		if now.Sub(c.last) > staleFailureSeriesTTL {
			delete(s.counts, k)
			continue
		}
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.CounterValue, c.n, k.namespace, k.workflow)
	}
}
