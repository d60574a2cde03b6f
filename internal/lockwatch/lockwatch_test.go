//go:build envtest

package lockwatch

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/rand"
	kwait "k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Options{}, &env))
}

// liveReader is the reader the guard gives the Watcher (NewReader).
func liveReader(t *testing.T) client.Reader {
	t.Helper()
	r, err := NewReader(env.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wait makes wf a Pending waiter on lock as Argo's controller writes one: the message, and
// the holder it waits behind (none when the lock has a free slot).
func wait(t *testing.T, wf *unstructured.Unstructured, lock string, free int, holder string) {
	t.Helper()
	status := wf.Object["status"].(map[string]any)
	status["message"] = "Waiting for " + lock + " lock. Lock status: " + map[int]string{0: "0", 1: "1"}[free] + "/1"
	if holder != "" {
		status["synchronization"] = map[string]any{"mutex": map[string]any{"waiting": []any{map[string]any{"holder": holder, "mutex": lock}}}}
	}
	if err := env.Client.Update(t.Context(), wf); err != nil {
		t.Fatal(err)
	}
}

// hold makes the Running wf declare that it holds lock.
func hold(t *testing.T, wf *unstructured.Unstructured, lock string) {
	t.Helper()
	wf.Object["status"].(map[string]any)["synchronization"] = map[string]any{"mutex": map[string]any{"holding": []any{map[string]any{"holder": wf.GetName(), "mutex": lock}}}}
	if err := env.Client.Update(t.Context(), wf); err != nil {
		t.Fatal(err)
	}
}

// cached waits until a list at resourceVersion 0 (the API server's watch cache, which the scan
// reads) holds wf in phase: under load the cache may lag a write by a moment.
func cached(t *testing.T, wf *unstructured.Unstructured, phase argo.Phase) {
	t.Helper()
	err := kwait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list := &argo.WorkflowList{}
		err := env.Client.List(ctx, list, client.InNamespace(wf.GetNamespace()), client.MatchingLabels{argo.LabelPhase: string(phase)},
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}})
		if err != nil {
			return false, nil //nolint:nilerr // try again until the deadline
		}
		for _, w := range list.Items {
			if w.UID == wf.GetUID() {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the watch cache did not show %s %s within 30 s: %v", wf.GetName(), phase, err)
	}
}

func TestStuckWaitersAreFoundAndOthersAreNot(t *testing.T) {
	c := env.Client
	ns := "t-" + rand.String(8)
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	lock := func(name string) string { return ns + "/Mutex/" + name }

	// Held by a completed workflow: the stale pass took the mutex and its write failed.
	done := testenv.CreateWorkflow(t, c, ns, "done", argo.PhaseSucceeded)
	behindDone := testenv.CreateWorkflow(t, c, ns, "behind-done", argo.PhasePending)
	wait(t, behindDone, lock("a"), 0, ns+"/"+done.GetName())
	// Held by a running workflow: an ordinary wait.
	running := testenv.CreateWorkflow(t, c, ns, "running", argo.PhaseRunning)
	hold(t, running, lock("b"))
	behindRunning := testenv.CreateWorkflow(t, c, ns, "behind-running", argo.PhasePending)
	wait(t, behindRunning, lock("b"), 0, ns+"/"+running.GetName())
	// Free, yet not given: a completed workflow's entry heads the queue.
	free := testenv.CreateWorkflow(t, c, ns, "free", argo.PhasePending)
	wait(t, free, lock("c"), 1, "")
	// "Free" is old news: a running workflow holds it now.
	holder := testenv.CreateWorkflow(t, c, ns, "holder", argo.PhaseRunning)
	hold(t, holder, lock("d"))
	oldNews := testenv.CreateWorkflow(t, c, ns, "old-news", argo.PhasePending)
	wait(t, oldNews, lock("d"), 1, "")
	// A lock that moves: one of its waiters is served while the other waits.
	first := testenv.CreateWorkflow(t, c, ns, "first", argo.PhasePending)
	wait(t, first, lock("e"), 1, "")
	second := testenv.CreateWorkflow(t, c, ns, "second", argo.PhasePending)
	wait(t, second, lock("e"), 1, "")
	// Pending for no lock.
	testenv.CreateWorkflow(t, c, ns, "queued", argo.PhasePending)

	var logs []string
	reg := prometheus.NewRegistry()
	w, err := New(liveReader(t), Options{Namespaces: []string{ns}, Registerer: reg, StuckAfter: 5 * time.Minute,
		Log: funcr.New(func(_, args string) { logs = append(logs, args) }, funcr.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	w.now = func() time.Time { return now }
	// Pages of 2: the scan reads every page, the Pending workflows of this test spread over 4.
	w.page = 2
	stuck := func() map[string]float64 {
		t.Helper()
		return scan(t, w, reg, "")
	}

	if got := stuck(); len(got) != 0 {
		t.Errorf("at the first scan: %v, want nothing stuck yet", got)
	}
	now = now.Add(3 * time.Minute)
	testenv.SetPhase(t, c, first, argo.PhaseRunning) // the lock moved: first got it
	cached(t, first, argo.PhaseRunning)
	if got := stuck(); len(got) != 0 {
		t.Errorf("after 3 minutes: %v, want nothing stuck yet", got)
	}
	now = now.Add(3 * time.Minute)
	want := map[string]float64{
		"cause=held-by-completed,lock=" + lock("a") + ",workflow_namespace=" + ns: 1,
		"cause=free-not-granted,lock=" + lock("c") + ",workflow_namespace=" + ns:  1,
	}
	if got := stuck(); !equal(got, want) {
		t.Errorf("after 6 minutes: %v, want %v", got, want)
	}
	now = now.Add(3 * time.Minute)
	want["cause=free-not-granted,lock="+lock("e")+",workflow_namespace="+ns] = 1
	if got := stuck(); !equal(got, want) {
		t.Errorf("after 9 minutes (5 since the lock e last moved): %v, want %v", got, want)
	}
	if n := len(logs); n != 3 || !strings.Contains(strings.Join(logs, "\n"), `"workflow"="`+ns+`/behind-done"`) {
		t.Errorf("log lines %q, want one for each of the 3 stuck waiters", logs)
	}
	// The remedy worked: the waiter got its lock. Its series ends.
	testenv.SetPhase(t, c, behindDone, argo.PhaseRunning)
	now = now.Add(time.Minute)
	delete(want, "cause=held-by-completed,lock="+lock("a")+",workflow_namespace="+ns)
	cached(t, behindDone, argo.PhaseRunning)
	if got := stuck(); !equal(got, want) {
		t.Errorf("after the waiter behind the completed holder got its lock: %v, want %v", got, want)
	}
}

func labels(m *dto.Metric) string {
	var ls []string
	for _, l := range m.GetLabel() {
		ls = append(ls, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(ls, ",")
}

func equal(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// scanner is a Watcher of ns on a test clock, and a read of its metric.
func scanner(t *testing.T, ns string) (w *Watcher, advance func(time.Duration), stuck func() map[string]float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	w, err := New(liveReader(t), Options{Registerer: reg, StuckAfter: 5 * time.Minute, Log: funcr.New(func(_, _ string) {}, funcr.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	w.now = func() time.Time { return now }
	return w, func(d time.Duration) { now = now.Add(d) }, func() map[string]float64 {
		t.Helper()
		return scan(t, w, reg, "workflow_namespace="+ns)
	}
}

// scan runs one scan of w and returns the stuck gauges reg holds, by their labels, those whose
// labels contain filter.
func scan(t *testing.T, w *Watcher, reg *prometheus.Registry, filter string) map[string]float64 {
	t.Helper()
	if err := w.Scan(t.Context()); err != nil {
		t.Fatal(err)
	}
	return gauges(t, reg, filter)
}

func namespace(t *testing.T) string {
	return testenv.Namespace(t, env.Client, "t-", nil)
}

// Ordinary waits whose status is old news, or whose lock lives elsewhere, are never stuck.
func TestOrdinaryWaitsAreNotStuck(t *testing.T) {
	c := env.Client
	ns, other := namespace(t), namespace(t)

	// A chain of waiters: r held the mutex and completed; x got it; v still says it waits
	// behind r (the controller woke x alone).
	r := testenv.CreateWorkflow(t, c, ns, "r", argo.PhaseSucceeded)
	x := testenv.CreateWorkflow(t, c, ns, "x", argo.PhaseRunning)
	hold(t, x, ns+"/Mutex/chain")
	v := testenv.CreateWorkflow(t, c, ns, "v", argo.PhasePending)
	wait(t, v, ns+"/Mutex/chain", 0, ns+"/"+r.GetName())

	// A lock of another namespace (Argo 3.6: mutex.namespace), held by a workflow there.
	shared := other + "/Mutex/shared"
	h := testenv.CreateWorkflow(t, c, other, "h", argo.PhaseRunning)
	hold(t, h, shared)
	q := testenv.CreateWorkflow(t, c, ns, "q", argo.PhasePending)
	wait(t, q, shared, 1, "")

	// Several locks at once (Argo 3.6: mutexes): p heads lock a's queue but waits on lock b,
	// which a running workflow holds; s, behind p on a, sees a free.
	b := testenv.CreateWorkflow(t, c, ns, "b-holder", argo.PhaseRunning)
	hold(t, b, ns+"/Mutex/b")
	p := testenv.CreateWorkflow(t, c, ns, "p", argo.PhasePending)
	p.Object["spec"].(map[string]any)["synchronization"] = map[string]any{"mutexes": []any{map[string]any{"name": "a"}, map[string]any{"name": "b"}}}
	wait(t, p, ns+"/Mutex/b", 0, ns+"/"+b.GetName())
	s := testenv.CreateWorkflow(t, c, ns, "s", argo.PhasePending)
	wait(t, s, ns+"/Mutex/a", 1, "")

	_, advance, stuck := scanner(t, ns)
	for range 3 {
		if got := stuck(); len(got) != 0 {
			t.Errorf("ordinary waits reported stuck: %v", got)
		}
		advance(4 * time.Minute)
	}
}

// A semaphore whose every slot a completed workflow holds: its waiters are stuck, and the
// holders are read from the semaphore's waiting entry.
func TestSemaphoreHeldByCompletedWorkflows(t *testing.T) {
	c := env.Client
	ns := namespace(t)
	lock := ns + "/ConfigMap/limits/deploy"
	d1 := testenv.CreateWorkflow(t, c, ns, "d1", argo.PhaseSucceeded)
	d2 := testenv.CreateWorkflow(t, c, ns, "d2", argo.PhaseFailed)
	wt := testenv.CreateWorkflow(t, c, ns, "waiter", argo.PhasePending)
	status := wt.Object["status"].(map[string]any)
	status["message"] = "Waiting for " + lock + " lock. Lock status: 0/2"
	status["synchronization"] = map[string]any{"semaphore": map[string]any{"waiting": []any{map[string]any{
		"semaphore": lock, "holders": []any{ns + "/" + d1.GetName(), ns + "/" + d2.GetName()}}}}}
	if err := c.Update(t.Context(), wt); err != nil {
		t.Fatal(err)
	}
	_, advance, stuck := scanner(t, ns)
	stuck()
	advance(6 * time.Minute)
	want := map[string]float64{"cause=held-by-completed,lock=" + lock + ",workflow_namespace=" + ns: 1}
	if got := stuck(); !equal(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
}

// flakyReader fails every List after the first ok of a scan while failing is set: a page read
// mid-scan fails, as on a flaky API server.
type flakyReader struct {
	client.Reader
	failing bool
	ok      int // Lists that still succeed before the failures begin
	calls   int
	// getsFail: every Get fails (the read of a holder).
	getsFail bool
}

func (r *flakyReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if r.getsFail {
		return errors.New("the API server does not answer")
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

func (r *flakyReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	r.calls++
	if r.failing && r.calls > r.ok {
		return errors.New("the API server does not answer")
	}
	return r.Reader.List(ctx, list, opts...)
}

// A scan whose later page fails changes no timer: the waiter on that page is not taken for
// served, and ExitGuardSyncLockStuck's gauge comes when its 5 minutes are up, however often
// scans fail in between.
func TestAFailedPageChangesNoTimer(t *testing.T) {
	c := env.Client
	ns := namespace(t)
	lock := ns + "/Mutex/a"
	done := testenv.CreateWorkflow(t, c, ns, "done", argo.PhaseSucceeded)
	// Two Pending workflows, one a page: the stuck waiter comes second (names in order).
	testenv.CreateWorkflow(t, c, ns, "a-queued", argo.PhasePending)
	behind := testenv.CreateWorkflow(t, c, ns, "z-behind-done", argo.PhasePending)
	wait(t, behind, lock, 0, ns+"/"+done.GetName())
	cached(t, behind, argo.PhasePending)

	reg := prometheus.NewRegistry()
	flaky := &flakyReader{Reader: liveReader(t)}
	w, err := New(flaky, Options{Namespaces: []string{ns}, Registerer: reg, StuckAfter: 5 * time.Minute, Log: funcr.New(func(_, _ string) {}, funcr.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	w.now = func() time.Time { return now }
	w.page = 1
	if got := scan(t, w, reg, ""); len(got) != 0 {
		t.Fatalf("at the first scan: %v, want nothing stuck yet", got)
	}
	for range 3 {
		// Every minute a scan whose second page fails.
		now = now.Add(time.Minute)
		flaky.failing, flaky.ok, flaky.calls = true, 1, 0
		if err := w.Scan(t.Context()); err == nil {
			t.Fatal("a scan whose page failed returned no error")
		}
	}
	flaky.failing = false
	now = now.Add(2 * time.Minute) // 5 minutes since the waiter was first seen stuck
	want := map[string]float64{"cause=held-by-completed,lock=" + lock + ",workflow_namespace=" + ns: 1}
	if got := scan(t, w, reg, ""); !equal(got, want) {
		t.Errorf("5 minutes after the first scan, failed scans between: %v, want %v", got, want)
	}
	// The holder cannot be read: the waiter stays stuck (its gauge does not drop, so the
	// alert's for-window runs on), and the scan says why.
	flaky.getsFail = true
	now = now.Add(time.Minute)
	if err := w.Scan(t.Context()); err == nil {
		t.Error("a scan that could not read a holder returned no error")
	}
	flaky.getsFail = false
	if got := gauges(t, reg, ""); !equal(got, want) {
		t.Errorf("after a scan that could not read the holder: %v, want %v", got, want)
	}
}

// gauges are the stuck gauges reg holds, by their labels, those whose labels contain filter.
func gauges(t *testing.T, reg *prometheus.Registry, filter string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if ls := labels(m); strings.Contains(ls, filter) {
				got[ls] = m.GetGauge().GetValue()
			}
		}
	}
	return got
}
