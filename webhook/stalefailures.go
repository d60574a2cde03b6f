package webhook

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

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
