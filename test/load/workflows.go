package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// sizes says how large the retained workflows are: most of them size bytes, and one in
// largeEvery (0: none) of them large bytes, as a few wide fan-outs make them.
type sizes struct {
	size, large, largeEvery int
}

func (s sizes) of(i int) int {
	if s.largeEvery > 0 && i%s.largeEvery == s.largeEvery-1 {
		return s.large
	}
	return s.size
}

func (s sizes) String() string {
	if s.largeEvery == 0 {
		return fmt.Sprintf("%d KB each", s.size/1000)
	}
	return fmt.Sprintf("%d KB, one in %d of %d KB", s.size/1000, s.largeEvery, s.large/1000)
}

// nodeTree is a status.nodes of about bytes bytes of JSON, shaped as Argo writes a workflow's
// steps: one entry per pod node, with times, outputs and children.
func nodeTree(wf string, bytes int) map[string]any {
	nodes := map[string]any{}
	for i, total := 0, 0; total < bytes; i++ {
		name := fmt.Sprintf("%s[%d].step-%d", wf, i/10, i)
		id := argo.NodeID(wf, name)
		node := map[string]any{
			"id": id, "name": name, "displayName": "step-" + strconv.Itoa(i), "type": "Pod",
			"templateName": "main", "templateScope": "local/" + wf, "phase": "Succeeded", "boundaryID": wf,
			"startedAt": "2026-11-30T12:00:00Z", "finishedAt": "2026-11-30T12:00:42Z", "progress": "1/1",
			"resourcesDuration": map[string]any{"cpu": 4, "memory": 42},
			"hostNodeName":      "node-" + strconv.Itoa(i%50),
			"outputs": map[string]any{"exitCode": "0", "parameters": []any{
				map[string]any{"name": "result", "value": fmt.Sprintf("s3://bucket/%s/%d/out.json", wf, i)}}},
			"children": []any{argo.NodeID(wf, name+".next")},
		}
		nodes[id] = node
		total += 640
	}
	return nodes
}

// retainedWorkflow is a Succeeded workflow as Argo leaves it: labels, spec, and its node tree.
func retainedWorkflow(ns, name string, bytes int) *unstructured.Unstructured {
	wf := &unstructured.Unstructured{}
	wf.SetGroupVersionKind(argo.WorkflowGVK)
	wf.SetNamespace(ns)
	wf.SetName(name)
	wf.SetAnnotations(map[string]string{"workflows.argoproj.io/pod-name-format": "v2"})
	wf.Object["spec"] = map[string]any{"entrypoint": "main", "onExit": "exit-handler", "templates": []any{
		map[string]any{"name": "main", "container": map[string]any{"image": "registry.invalid/app:1", "command": []any{"run"}}},
		map[string]any{"name": "exit-handler", "container": map[string]any{"image": "registry.invalid/notify:1"}},
	}}
	fixture.MarkPhase(wf, argo.PhaseSucceeded)
	wf.Object["status"].(map[string]any)["nodes"] = nodeTree(name, bytes)
	wf.Object["status"].(map[string]any)["startedAt"] = "2026-11-30T12:00:00Z"
	wf.Object["status"].(map[string]any)["finishedAt"] = "2026-11-30T12:05:00Z"
	return wf
}

// createRetained creates the retained workflows wf-<from> to wf-<to - 1> in ns, with workers
// in parallel, and returns the bytes of JSON they hold and the newest resourceVersion written.
func createRetained(ctx context.Context, c client.Client, ns string, from, to int, sz sizes, progress func(done int)) (int64, uint64, error) {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		return 0, 0, err
	}
	const workers = 16
	var next, done, total atomic.Int64
	var lastRV atomic.Uint64
	next.Store(int64(from))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= to || ctx.Err() != nil {
					return
				}
				wf := retainedWorkflow(ns, fmt.Sprintf("wf-%d", i), sz.of(i))
				raw, _ := wf.MarshalJSON()
				if err := c.Create(ctx, wf); err != nil {
					errs <- fmt.Errorf("creating workflow %d: %w", i, err)
					return
				}
				total.Add(int64(len(raw)))
				if rv, err := strconv.ParseUint(wf.GetResourceVersion(), 10, 64); err == nil {
					for old := lastRV.Load(); rv > old && !lastRV.CompareAndSwap(old, rv); old = lastRV.Load() {
					}
				}
				if d := done.Add(1); progress != nil && d%5000 == 0 {
					progress(int(d))
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, err
	}
	return total.Load(), lastRV.Load(), ctx.Err()
}
