//go:build envtest

package webhook

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// BenchmarkDecide measures one decision against the real test API server: an exit-handler pod
// with its live read (the default), the same decided store-first, a step pod (store-first by
// default), and a pod the policy does not cover. Run with: go test -run '^$' -bench Decide ./webhook (docs/evidence/performance.md).
func BenchmarkDecide(b *testing.B) {
	ns := newNamespace(b)
	wf := createWorkflow(b, ns, "bench", argo.PhaseRunning)
	// A workflow of about 1 MiB, as large node trees make them.
	big := createWorkflow(b, ns, "bench-big", argo.PhaseRunning)
	big.Object["status"].(map[string]any)["nodes"] = map[string]any{"n": map[string]any{"message": strings.Repeat("x", 1<<20)}}
	if err := env.Client.Update(b.Context(), big); err != nil {
		b.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: testScheme(b)})
	if err != nil {
		b.Fatal(err)
	}
	store, err := completionstore.New(completionstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	// The watch has advanced just now, as a running guard's does: store-first may trust it.
	store.Progress("1")
	for _, tc := range []struct {
		name string
		opts Options
		pod  metav1.ObjectMeta
	}{
		{"exit-handler-live-read", Options{}, fixture.ExitPod(wf).ObjectMeta},
		{"exit-handler-live-read-1MiB-workflow", Options{}, fixture.ExitPod(big).ObjectMeta},
		{"exit-handler-store-first", Options{StoreFirst: true}, fixture.ExitPod(wf).ObjectMeta},
		{"step-pod-store-first", Options{}, fixture.Pod(wf, "step", wf.GetName()).ObjectMeta},
		{"pod-not-covered", Options{Cover: Coverage{NoSteps: true}}, fixture.Pod(wf, "step", wf.GetName()).ObjectMeta},
	} {
		b.Run(tc.name, func(b *testing.B) {
			g, err := newGuard(c, store, tc.opts)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if d := g.decide(b.Context(), classify(&tc.pod)); d.deny {
					b.Fatal("denied a pod of a running workflow")
				}
			}
		})
	}
}

// BenchmarkLiveReadBySize compares, for a small workflow and one of about 1 MiB, three ways to
// read a workflow consistently (no resourceVersion): a GET of the whole object (decoded into
// argo.Workflow), a GET of its metadata only, and the LIST by metadata.name that the live read
// makes (readWorkflow). A thousand other workflows share the namespace.
func BenchmarkLiveReadBySize(b *testing.B) {
	ns := newNamespace(b)
	createWorkflow(b, ns, "small", argo.PhaseRunning)
	big := createWorkflow(b, ns, "big", argo.PhaseRunning)
	big.Object["status"].(map[string]any)["nodes"] = map[string]any{"n": map[string]any{"message": strings.Repeat("x", 1<<20)}}
	if err := env.Client.Update(b.Context(), big); err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		createWorkflow(b, ns, fmt.Sprintf("other-%d", i), argo.PhaseSucceeded)
	}
	c, err := client.New(env.Config, client.Options{Scheme: testScheme(b)})
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"small", "big"} {
		key := client.ObjectKey{Namespace: ns, Name: name}
		b.Run(name+"/get-whole-object", func(b *testing.B) {
			for b.Loop() {
				if err := c.Get(b.Context(), key, &argo.Workflow{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/get-metadata", func(b *testing.B) {
			for b.Loop() {
				m := &metav1.PartialObjectMetadata{}
				m.SetGroupVersionKind(argo.WorkflowGVK)
				if err := c.Get(b.Context(), key, m); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/list-metadata-by-name", func(b *testing.B) {
			for b.Loop() {
				l := &metav1.PartialObjectMetadataList{}
				l.SetGroupVersionKind(argo.WorkflowListGVK)
				if err := c.List(b.Context(), l, client.InNamespace(ns), client.MatchingFields{"metadata.name": name}); err != nil {
					b.Fatal(err)
				}
				if len(l.Items) != 1 {
					b.Fatalf("the list by name returned %d workflows", len(l.Items))
				}
			}
		})
	}
}
