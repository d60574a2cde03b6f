//go:build envtest

package webhook

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// Whoever may create WorkflowTaskSets can send the guard creates of tens of thousands of tasks,
// each a request of up to megabytes, owned by a running workflow: all admitted, and each
// remembered for row T6 unless bounded (and logged whole, unless bounded). Through the real API
// server, 30 creates of 10,000 tasks (above maxCreateBytes: not remembered; larger ones take the
// race detector past the webhook's timeout) and then 60 of 7,000 (each under it, 50 MiB by the
// estimate in all: the byte bound must hold them): the guard's heap, after collections, grows by
// no more than that bound and 8 MiB, not by the 720,000 tasks sent (72 MiB with the count bound
// alone).
func TestTaskSetCreatesKeepTheGuardsMemoryBounded(t *testing.T) {
	startGuard(t, Options{}, harnessOptions{})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "flooded", argo.PhaseRunning)
	send := func(prefix string, creates, tasks int) {
		t.Helper()
		for i := range creates {
			m := make(map[string]any, tasks)
			for k := range tasks {
				m[fmt.Sprintf("t%05d", k)] = map[string]any{"name": "x"}
			}
			ts := fixture.TaskSet(wf, m)
			ts.SetName(fmt.Sprintf("%s-%02d", prefix, i))
			if err := env.Client.Create(t.Context(), ts); err != nil {
				t.Fatalf("creating TaskSet %s of %d tasks: %v, want admitted (the workflow runs)", ts.GetName(), tasks, err)
			}
		}
	}
	heap := func() int64 {
		// Twice: what sync.Pools held before the first survives it.
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapInuse)
	}
	before := heap()
	send("huge", 30, 10000)
	mid := heap()
	send("large", 60, 7000)
	after := heap()
	t.Logf("the guard's heap grew by %.1f MiB after 30 creates of 10,000 tasks, then by %.1f MiB after 60 of 7,000 (the memory's bound: %d MiB)",
		float64(mid-before)/(1<<20), float64(after-mid)/(1<<20), maxCreatesBytes>>20)
	if limit := int64(maxCreatesBytes + 8<<20); after-before > limit {
		t.Errorf("the guard's heap grew by %d MiB, past %d MiB: what it keeps of TaskSet creates is not bounded", (after-before)>>20, limit>>20)
	}
}
