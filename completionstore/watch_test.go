//go:build envtest

package completionstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	log.SetLogger(logr.Discard()) // the store's tests read no logs
	os.Exit(testenv.Main(m, testenv.Options{}, &env))
}

func scheme(t testing.TB) *k8sruntime.Scheme {
	s, err := argo.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newWorkflow(t testing.TB, ns, name string, nodes int) *unstructured.Unstructured {
	wf := &unstructured.Unstructured{}
	wf.SetGroupVersionKind(argo.WorkflowGVK)
	wf.SetNamespace(ns)
	wf.SetName(name)
	wf.SetAnnotations(map[string]string{"workflows.argoproj.io/pod-name-format": "v2"})
	wf.Object["spec"] = map[string]any{"entrypoint": "main", "onExit": "exit-handler"}
	fixture.MarkPhase(wf, argo.PhaseRunning)
	status := wf.Object["status"].(map[string]any)
	if nodes > 0 {
		// A node tree like the one that makes real workflows megabytes large.
		tree := map[string]any{}
		for i := range nodes {
			id := fmt.Sprintf("%s-%d", name, i)
			tree[id] = map[string]any{"id": id, "name": fmt.Sprintf("%s[%d].step-%d", name, i, i), "displayName": fmt.Sprintf("step-%d", i),
				"type": "Pod", "templateName": "main", "phase": "Succeeded", "startedAt": "2026-11-30T12:00:00Z",
				"finishedAt": "2026-11-30T12:00:10Z", "message": strings.Repeat("x", 120),
				"outputs": map[string]any{"parameters": []any{map[string]any{"name": "out", "value": strings.Repeat("v", 200)}}}}
		}
		status["nodes"] = tree
	}
	if err := env.Client.Create(context.Background(), wf); err != nil {
		t.Fatal(err)
	}
	return wf
}

func TestWatchFeedsTheStoreFromTheAPIServer(t *testing.T) {
	s := scheme(t)
	wfObj, byObj := CacheByObject(nil)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: s, Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{wfObj: byObj}}})
	if err != nil {
		t.Fatal(err)
	}
	store, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	ns := "default"
	before := newWorkflow(t, ns, "before-"+rand.String(5), 0) // exists before the guard starts
	fixture.MarkPhase(before, argo.PhaseSucceeded)
	if err := env.Client.Update(t.Context(), before); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	reg := prometheus.NewRegistry()
	synced, err := Watch(ctx, mgr, store, WatchOptions{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "/readyz", nil)
	if synced(req) == nil {
		t.Error("readiness passed before the manager started")
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}()
	poll := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true,
			func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("never: %s", what)
		}
	}
	poll("synced", func() bool { return synced(req) == nil })
	// Readiness means the initial list is in the store, not only in the informer.
	if r, ok := store.Get(before.GetUID()); !ok || r.Phase != argo.PhaseSucceeded {
		t.Errorf("after sync the store holds %+v, %v for a workflow completed before the start", r, ok)
	}

	// The initial list's workflows were written before the watch began: no lag sample.
	if lag, at := store.LastLag(); !at.IsZero() {
		t.Errorf("a lag sample (%s) from the initial list, want none", lag)
	}

	wf := newWorkflow(t, ns, "live-"+rand.String(5), 0)
	fixture.MarkPhase(wf, argo.PhaseSucceeded)
	if err := env.Client.Update(t.Context(), wf); err != nil {
		t.Fatal(err)
	}
	poll("the completion is recorded", func() bool {
		r, ok := store.Get(wf.GetUID())
		return ok && r.Phase == argo.PhaseSucceeded && r.ResourceVersion == wf.GetResourceVersion()
	})
	// The watch's progress is the newest resourceVersion it reached, and is in the metrics.
	poll("the watch's progress reaches the completion", func() bool {
		rv, _ := store.LastProgress()
		cmp, err := resourceversion.CompareResourceVersion(rv, wf.GetResourceVersion())
		return err == nil && cmp >= 0 && store.WatchFresh()
	})
	// The update's managed fields tell when it was written (to the second): the store took a
	// lag sample of it, of less than the second's rounding and this machine's delay.
	lag, lagAt := store.LastLag()
	if lagAt.IsZero() || lag > 3*time.Second {
		t.Errorf("lag sample after a live update: %s at %v, want one, of at most a few seconds", lag, lagAt)
	}
	// What Recall reads from the informer carries its write's time, as the watch's states do:
	// without it, a recalled running state would overturn any refusal.
	if o, ok := store.informer(t.Context(), ns, wf.GetName()); !ok || o.WrittenAt.IsZero() {
		t.Errorf("the informer's state for Recall = %+v, %v; want one with its write's time", o, ok)
	}
	rv, at := store.LastProgress()
	gauges := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetGauge() != nil {
			gauges[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if want, _ := strconv.ParseFloat(rv, 64); gauges["exit_guard_watch_resource_version"] != want {
		t.Errorf("exit_guard_watch_resource_version = %v, want %v", gauges["exit_guard_watch_resource_version"], want)
	}
	if got := gauges["exit_guard_watch_lag_seconds"]; got != lag.Seconds() {
		t.Errorf("exit_guard_watch_lag_seconds = %v, want %v", got, lag.Seconds())
	}
	if got := gauges["exit_guard_watch_last_progress_timestamp_seconds"]; got != float64(at.UnixNano())/1e9 {
		t.Errorf("exit_guard_watch_last_progress_timestamp_seconds = %v, want %v", got, float64(at.UnixNano())/1e9)
	}
	if err := env.Client.Delete(t.Context(), wf); err != nil {
		t.Fatal(err)
	}
	poll("the deletion leaves a tombstone", func() bool {
		r, ok := store.Get(wf.GetUID())
		return ok && r.Deleted && r.Phase == argo.PhaseSucceeded
	})
}

// BenchmarkCacheMemory measures what the guard's Workflow cache holds per workflow, with the
// metadata-only informer and transform of CacheByObject, against a cache of whole
// unstructured workflows. Run
// with: go test -run '^$' -bench CacheMemory ./completionstore (docs/evidence/performance.md).
func BenchmarkCacheMemory(b *testing.B) {
	const workflows, nodes = 50, 2000
	ns := "bench-" + rand.String(5)
	nsObj := &unstructured.Unstructured{}
	nsObj.SetAPIVersion("v1")
	nsObj.SetKind("Namespace")
	nsObj.SetName(ns)
	if err := env.Client.Create(context.Background(), nsObj); err != nil {
		b.Fatal(err)
	}
	var size int
	for i := range workflows {
		wf := newWorkflow(b, ns, fmt.Sprintf("wf-%d", i), nodes)
		raw, _ := wf.MarshalJSON()
		size = len(raw)
	}
	b.Logf("%d workflows of %d KiB each", workflows, size/1024)
	for _, tc := range []struct {
		name string
		obj  client.Object
		by   cache.ByObject
	}{
		{"metadata-and-stripped", workflowMetadata(), cache.ByObject{Transform: stripWorkflow, Namespaces: map[string]cache.Config{ns: {}}}},
		{"unstructured", &unstructured.Unstructured{Object: map[string]any{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow"}},
			cache.ByObject{Namespaces: map[string]cache.Config{ns: {}}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				before := heapInUse()
				c, err := cache.New(env.Config, cache.Options{Scheme: scheme(b), ByObject: map[client.Object]cache.ByObject{tc.obj: tc.by}})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				inf, err := c.GetInformer(ctx, tc.obj, cache.BlockUntilSynced(false))
				if err != nil {
					b.Fatal(err)
				}
				go func() { _ = c.Start(ctx) }()
				if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
					b.Fatal("cache never synced")
				}
				after := heapInUse()
				b.ReportMetric(float64(after-before)/workflows, "heap-bytes/workflow")
				runtime.KeepAlive(c)
				cancel()
			}
		})
	}
}

func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}
