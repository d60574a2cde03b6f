//go:build envtest

package lockwatch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// countingBody counts the bytes read from a response body.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// countingTransport counts the requests and the response bytes that pass through it.
type countingTransport struct {
	next           http.RoundTripper
	requests, body atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	resp, err := c.next.RoundTrip(r)
	if err == nil {
		resp.Body = countingBody{resp.Body, &c.body}
	}
	return resp, err
}

// peakHeap samples the heap in use every millisecond until stop is closed and returns its
// highest value.
func peakHeap(stop <-chan struct{}) func() uint64 {
	var peak uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return func() uint64 { wg.Wait(); return peak }
}

// BenchmarkScanWithAStuckWaiter measures one scan that finds a waiter stuck behind a completed
// workflow, in a namespace of 1,000 Running workflows of 100 nodes each: the scan lists the
// Pending workflows, then, the waiter suspect for --lock-stuck-after, the Running ones, to see
// whether they hold every slot. It reports the peak heap above what the process held before the
// scan, the bytes the API server sent and the requests. docs/evidence/reliability.md, "Held
// locks", has the figures.
func BenchmarkScanWithAStuckWaiter(b *testing.B) {
	const running, nodes = 1000, 100
	c := env.Client
	ns := "b-" + rand.String(8)
	if err := c.Create(b.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	lock := ns + "/Mutex/probe"
	for i := range running {
		wf := fixture.Workflow(ns, fmt.Sprintf("running-%04d", i))
		fixture.MarkPhase(wf, argo.PhaseRunning)
		tree := map[string]any{}
		for j := range nodes {
			id := fmt.Sprintf("%s-%d", wf.GetName(), 1000000000+j)
			tree[id] = map[string]any{"id": id, "name": fmt.Sprintf("%s[%d].step-%d", wf.GetName(), j/10, j), "displayName": fmt.Sprintf("step-%d", j),
				"type": "Pod", "templateName": "work", "templateScope": "local/" + wf.GetName(), "phase": "Succeeded", "boundaryID": wf.GetName(),
				"startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:10Z", "progress": "1/1",
				"resourcesDuration": map[string]any{"cpu": 10, "memory": 10}, "hostNodeName": "node-1",
				"outputs": map[string]any{"exitCode": "0", "artifacts": []any{map[string]any{"name": "main-logs", "s3": map[string]any{"key": wf.GetName() + "/" + id + "/main.log"}}}}}
		}
		wf.Object["status"].(map[string]any)["nodes"] = tree
		if i < 3 {
			// A few that hold other locks.
			wf.Object["status"].(map[string]any)["synchronization"] = map[string]any{"mutex": map[string]any{"holding": []any{map[string]any{"holder": wf.GetName(), "mutex": fmt.Sprintf("%s/Mutex/other-%d", ns, i)}}}}
		}
		if err := c.Create(b.Context(), wf); err != nil {
			b.Fatal(err)
		}
	}
	done := fixture.Workflow(ns, "done")
	fixture.MarkPhase(done, argo.PhaseSucceeded)
	if err := c.Create(b.Context(), done); err != nil {
		b.Fatal(err)
	}
	waiter := fixture.Workflow(ns, "waiter")
	fixture.MarkPhase(waiter, argo.PhasePending)
	waiter.Object["status"].(map[string]any)["message"] = "Waiting for " + lock + " lock. Lock status: 0/1"
	waiter.Object["status"].(map[string]any)["synchronization"] = map[string]any{"mutex": map[string]any{"waiting": []any{map[string]any{"holder": ns + "/done", "mutex": lock}}}}
	if err := c.Create(b.Context(), waiter); err != nil {
		b.Fatal(err)
	}

	counter := &countingTransport{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter }
	reader := benchReader(b, cfg)
	w, err := New(reader, Options{Namespaces: []string{ns}, Registerer: prometheus.NewRegistry(), StuckAfter: time.Minute, Log: logr.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	w.now = func() time.Time { return now }
	if err := w.Scan(b.Context()); err != nil { // the waiter becomes suspect
		b.Fatal(err)
	}
	var peak uint64
	var requests, body int64
	b.ResetTimer()
	for range b.N {
		now = now.Add(2 * time.Minute)
		b.StopTimer()
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		r0, b0 := counter.requests.Load(), counter.body.Load()
		stop := make(chan struct{})
		highest := peakHeap(stop)
		b.StartTimer()
		if err := w.Scan(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		close(stop)
		if h := highest(); h > before.HeapInuse {
			peak = max(peak, h-before.HeapInuse)
		}
		requests += counter.requests.Load() - r0
		body += counter.body.Load() - b0
		b.StartTimer()
	}
	b.StopTimer()
	if got := testutilStuck(b, w); got != 1 {
		b.Fatalf("the scan found %v stuck waiters, want 1", got)
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(body)/float64(b.N)/(1<<20), "api-MiB/op")
	b.ReportMetric(float64(requests)/float64(b.N), "requests/op")
}

// testutilStuck sums the stuck-waiter gauge.
func testutilStuck(b *testing.B, w *Watcher) float64 {
	b.Helper()
	ch := make(chan prometheus.Metric, 16)
	w.stuck.Collect(ch)
	close(ch)
	var sum float64
	for m := range ch {
		var d dtoMetric
		if err := m.Write(&d.Metric); err != nil {
			b.Fatal(err)
		}
		sum += d.GetGauge().GetValue()
	}
	return sum
}

// benchReader is the reader the Watcher is given in the guard (NewReader).
func benchReader(b *testing.B, cfg *rest.Config) client.Reader {
	b.Helper()
	c, err := NewReader(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

type dtoMetric struct{ dto.Metric }
