package webhook

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A workflow's series counts its stale passes, and ends a day after the last one; another
// workflow's series lives on.
func TestStaleFailureSeriesEndAfterTheirTTL(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := newStaleFailures()
	s.now = func() time.Time { return now }
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	read := func(ns, wf string) float64 {
		t.Helper()
		return gathered(t, reg, "exit_guard_stale_failures_total", map[string]string{"workflow_namespace": ns, "workflow": wf})
	}

	s.inc("a", "done")
	s.inc("a", "done")
	s.inc("b", "done") // the same name in another namespace is another workflow
	if got := read("a", "done"); got != 2 {
		t.Errorf("a/done = %v, want 2", got)
	}
	now = now.Add(staleFailureSeriesTTL / 2)
	s.inc("b", "done")
	now = now.Add(staleFailureSeriesTTL/2 + time.Second)
	if got := read("a", "done"); got != 0 {
		t.Errorf("a/done a day after its last count = %v, want its series gone", got)
	}
	if got := read("b", "done"); got != 2 {
		t.Errorf("b/done, counted half a day ago = %v, want 2", got)
	}
	if len(s.counts) != 1 {
		t.Errorf("%d workflows remembered, want 1", len(s.counts))
	}
}
