package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// watcherCommand runs a watcher of whole Workflows in this process (startWatcher's child).
const watcherCommand = "watcher"

// runWatcher informs on every Workflow with the given shape and serves /readyz (passes once
// the initial list has been delivered) and /rv (the newest resourceVersion an event brought).
func runWatcher(args []string) error {
	fs := flag.NewFlagSet(watcherCommand, flag.ContinueOnError)
	shape := fs.String("shape", shapeFull, "full-object or full-stream-typed")
	probe := fs.String("probe", "127.0.0.1:0", "The address of /readyz and /rv.")
	ctx, stop, err := startChild(fs, args)
	if err != nil {
		return err
	}
	defer stop()
	cfg, err := unthrottledConfig()
	if err != nil {
		return err
	}
	scheme, err := argo.NewScheme()
	if err != nil {
		return err
	}
	var obj client.Object
	byObject := cache.ByObject{}
	switch *shape {
	case shapeFull:
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(argo.WorkflowGVK)
		obj = u
	case shapePhase:
		obj = &argo.Workflow{}
		byObject.Transform = stripTyped
	default:
		return fmt.Errorf("unknown shape %q", *shape)
	}
	c, err := cache.New(cfg, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{obj: byObject}})
	if err != nil {
		return err
	}
	inf, err := c.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
	if err != nil {
		return err
	}
	var rv atomic.Uint64
	seen := func(o any) {
		if m, ok := o.(metav1.Object); ok {
			if n, err := strconv.ParseUint(m.GetResourceVersion(), 10, 64); err == nil {
				for {
					old := rv.Load()
					if n <= old || rv.CompareAndSwap(old, n) {
						break
					}
				}
			}
		}
	}
	handle, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }, DeleteFunc: seen,
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !handle.HasSynced() {
			http.Error(w, "not synced", http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/rv", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintln(w, rv.Load())
	})
	srv := &http.Server{Addr: *probe, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() { _ = c.Start(ctx) }()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// stripTyped is the transform the guard's watch used when it decoded whole objects into
// argo.Workflow: identity, resourceVersion and phase kept.
func stripTyped(obj any) (any, error) {
	wf, ok := obj.(*argo.Workflow)
	if !ok {
		return obj, nil
	}
	return &argo.Workflow{
		TypeMeta: wf.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Namespace: wf.Namespace, Name: wf.Name, UID: wf.UID,
			ResourceVersion: wf.ResourceVersion, DeletionTimestamp: wf.DeletionTimestamp},
		Status: argo.WorkflowStatus{Phase: wf.Status.Phase},
	}, nil
}
