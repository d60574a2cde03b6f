//go:build envtest

package webhook

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// unreachableConfig points a client at a loopback listener. With hang, it accepts connections
// and never answers (a live read runs out of time); without, it closes them at once (a live
// read fails fast).
func unreachableConfig(t *testing.T, hang bool) *rest.Config {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if hang {
				held = append(held, c)
			} else {
				_ = c.Close()
			}
		}
	}()
	cfg := rest.CopyConfig(env.Config)
	cfg.Host = "https://" + ln.Addr().String()
	return cfg
}

// TestLiveReadThroughTheAPIServer checks the rows of docs/decisions.md that are about what the
// live read sees and how it fails, with real reads: workflows on the real API server whose
// labels do not settle the phase (or contradict the status), a workflow deleted, a name
// reused, and an API server that refuses connections or never answers.
func TestLiveReadThroughTheAPIServer(t *testing.T) {
	ns := newNamespace(t)
	scheme := testScheme(t)
	newReader := func(cfg *rest.Config) client.Reader {
		p, err := newLiveClient(cfg, scheme)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// live counts its GETs: the whole object is read only when the labels do not settle the
	// phase, or settle it on one that would refuse.
	var gets atomic.Int32
	live := countingGets{Reader: newReader(env.Config), gets: &gets}
	failing := newReader(unreachableConfig(t, false))
	hanging := newReader(unreachableConfig(t, true))

	running := createWorkflow(t, ns, "running", argo.PhaseRunning)
	failed := createWorkflow(t, ns, "failed", argo.PhaseFailed)
	succeeded := createWorkflow(t, ns, "succeeded", argo.PhaseSucceeded)
	deleted := createWorkflow(t, ns, "deleted", argo.PhaseSucceeded)
	if err := env.Client.Delete(t.Context(), deleted); err != nil {
		t.Fatal(err)
	}
	replaced := createWorkflow(t, ns, "replaced", argo.PhaseSucceeded)
	oldUID := replaced.GetUID()
	if err := env.Client.Delete(t.Context(), replaced); err != nil {
		t.Fatal(err)
	}
	replaced = createWorkflow(t, ns, "replaced", argo.PhaseRunning)
	replaced.SetUID(oldUID) // pods of the first one still name its UID
	// Workflows whose labels do not settle the phase: the live read GETs the whole object.
	retriedV4 := createWorkflow(t, ns, "retried-v4", argo.PhaseSucceeded)
	setPhase(t, retriedV4, argo.PhaseUnknown) // status.phase "", completed removed, phase label stale
	daemon := createWorkflow(t, ns, "daemon", argo.PhaseSucceeded)
	labels := daemon.GetLabels()
	labels[argo.LabelCompleted] = "false" // 3.4 with daemon steps: the phase before the label
	daemon.SetLabels(labels)
	if err := env.Client.Update(t.Context(), daemon); err != nil {
		t.Fatal(err)
	}
	// Labels that say Succeeded over a status that says Running: Argo never writes this, and
	// the status wins (a refusal is decided from the status only).
	labelsOnly := createWorkflow(t, ns, "labels-only", argo.PhaseRunning)
	labels = labelsOnly.GetLabels()
	labels[argo.LabelPhase], labels[argo.LabelCompleted] = string(argo.PhaseSucceeded), "true"
	labelsOnly.SetLabels(labels)
	if err := env.Client.Update(t.Context(), labelsOnly); err != nil {
		t.Fatal(err)
	}

	for _, r := range []struct {
		name   string
		wf     *unstructured.Unstructured
		opts   Options
		reader client.Reader
		store  storeState
		deny   bool
		reason contract.Reason
		source source
		row    string
		// whole, when set: whether the live read GETs the whole object.
		whole *bool
	}{
		{name: "live Running", wf: running, store: storeSucceeded, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive, row: "5"},
		{name: "retried by v4: stale Succeeded phase label, status.phase empty", wf: retriedV4, store: storeSucceeded, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive, row: "5"},
		{name: "labels say Succeeded, status.phase Running: the status decides", wf: labelsOnly, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive, row: "5"},
		{name: "live Succeeded", wf: succeeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, row: "6"},
		{name: "daemon steps: Succeeded before the completed label", wf: daemon, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, row: "6"},
		{name: "store-first, store unsettled, daemon steps: live confirms", wf: daemon, opts: Options{StoreFirst: true}, store: storeUnsettled, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, row: "6"},
		{name: "store-first, store unsettled, retried by v4: live says not terminal", wf: retriedV4, opts: Options{StoreFirst: true}, store: storeUnsettled, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive, row: "5"},
		{name: "live Failed, Failed denied: the whole object read", wf: failed, opts: Options{DenyPhases: []argo.Phase{argo.PhaseFailed}}, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, row: "6", whole: ptr.To(true)},
		{name: "live Failed, default policy: the labels settle it", wf: failed, store: storeFailed, reason: contract.ReasonPhaseNotDenied, source: sourceLive, row: "7", whole: ptr.To(false)},
		{name: "live 404", wf: deleted, deny: true, reason: contract.ReasonWorkflowDeleted, source: sourceLive, row: "8"},
		{name: "live other UID", wf: replaced, deny: true, reason: contract.ReasonWorkflowReplaced, source: sourceLive, row: "9"},
		{name: "connections refused, store tombstone", wf: running, reader: failing, store: storeTombstone, deny: true, reason: contract.ReasonWorkflowDeleted, source: sourceStore, row: "10"},
		{name: "connections refused, store Succeeded, watch fresh", wf: running, reader: failing, store: storeSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore, row: "11"},
		{name: "connections refused, store Succeeded, tombstone fallback", wf: running, opts: Options{StoreFallback: FallbackTombstone}, reader: failing, store: storeSucceeded, reason: contract.ReasonUnconfirmedCompletion, source: sourceStore, row: "11"},
		{name: "no answer, store Succeeded, completion fallback", wf: running, opts: Options{StoreFallback: FallbackCompletion}, reader: hanging, store: storeSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore, row: "11"},
		{name: "no answer, store unsettled", wf: running, reader: hanging, store: storeUnsettled, reason: contract.ReasonUnverifiedFailOpen, source: sourceStore, row: "14"},
		{name: "no answer, store empty", wf: succeeded, reader: hanging, reason: contract.ReasonUnverifiedFailOpen, row: "15"},
	} {
		t.Run(r.row+" "+r.name, func(t *testing.T) {
			reader := r.reader
			if reader == nil {
				reader = live
			}
			r.opts.LiveReadTimeout, r.opts.LiveReadBudget = 300*time.Millisecond, time.Second
			g, err := newGuard(reader, storeFor(t, r.wf, r.store, false), r.opts)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			gets.Store(0)
			d := g.decide(t.Context(), podFacts(t, fixture.ExitPod(r.wf)))
			if r.whole != nil && (gets.Load() > 0) != *r.whole {
				t.Errorf("the live read made %d GETs of the whole object; want one: %v", gets.Load(), *r.whole)
			}
			if d.deny != r.deny || d.reason != r.reason || d.source != r.source || d.row != r.row {
				t.Errorf("decision = deny %v reason %s source %q row %s, want deny %v reason %s source %q row %s (live error: %v)",
					d.deny, d.reason, d.source, d.row, r.deny, r.reason, r.source, r.row, d.liveErr)
			}
			if r.reader == hanging && time.Since(start) > 5*time.Second {
				t.Errorf("a hanging live read held the decision %s, past any webhook timeout", time.Since(start))
			}
		})
	}
}

// countingGets counts the GETs of whole objects its reader makes.
type countingGets struct {
	client.Reader
	gets *atomic.Int32
}

func (c countingGets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	return c.Reader.Get(ctx, key, obj, opts...)
}

// The live read answers from the API server's watch cache (a LIST by name), yet it must never
// return an older state than the newest write: each read right after a write sees that write.
func TestLiveReadSeesTheNewestWrite(t *testing.T) {
	ns := newNamespace(t)
	c, err := newLiveClient(env.Config, testScheme(t))
	if err != nil {
		t.Fatal(err)
	}
	store, err := completionstore.New(completionstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGuard(c, store, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wf := createWorkflow(t, ns, "read-your-writes", argo.PhaseRunning)
	const writes = 300
	for i := range writes {
		phase := []argo.Phase{argo.PhaseRunning, argo.PhaseSucceeded, argo.PhaseFailed}[i%3]
		setPhase(t, wf, phase)
		got, err := g.liveRead(t.Context(), ns, wf.GetName(), g.podRead)
		if err != nil {
			t.Fatal(err)
		}
		if got.ResourceVersion != wf.GetResourceVersion() || got.Status.Phase != phase {
			t.Fatalf("write %d of %d: the live read returned resourceVersion %s phase %s, want the write's %s %s",
				i+1, writes, got.ResourceVersion, got.Status.Phase, wf.GetResourceVersion(), phase)
		}
	}
}

// Row T6's whole read of the name's holder is a live read like the others: timed in the
// live-read histogram, its failures counted, and, being a further read beyond the decision's
// first, shed when the process has as many further reads in flight as it allows. It keeps of the
// workflow only the name, type and phase of each node.
func TestNameHoldersReadIsALiveRead(t *testing.T) {
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "holder", argo.PhaseRunning)
	var fail atomic.Bool
	var gets atomic.Int32
	path, err := newLiveClient(env.Config, testScheme(t))
	if err != nil {
		t.Fatal(err)
	}
	reader := beforeGet{Reader: path, hook: func() error {
		gets.Add(1)
		if fail.Load() {
			return errors.New("connection reset by peer")
		}
		return nil
	}}
	g, err := newGuard(reader, storeFor(t, tableWorkflow, storeEmpty, false), Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := g.metrics.register(reg); err != nil {
		t.Fatal(err)
	}
	count := func(name string, labels map[string]string) float64 { t.Helper(); return gathered(t, reg, name, labels) }

	uid, phase, _, err := g.liveNodes(t.Context(), ns, "holder")
	if err != nil || uid != wf.GetUID() || phase != argo.PhaseRunning {
		t.Fatalf("the read: uid %s phase %q err %v, want %s Running", uid, phase, err, wf.GetUID())
	}
	if got := count("exit_guard_live_read_duration_seconds", map[string]string{"result": "found"}); got != 1 {
		t.Errorf("reads timed as found: %v, want 1", got)
	}
	fail.Store(true)
	if _, _, _, err := g.liveNodes(t.Context(), ns, "holder"); err == nil {
		t.Fatal("a failed read returned no error")
	}
	if got := count("exit_guard_live_read_failures_total", map[string]string{"kind": "error"}); got != 1 {
		t.Errorf("live-read failures of kind error: %v, want 1", got)
	}
	// Every further read of the process in flight: this one is shed, not made.
	for range maxExtraLiveReads {
		g.extraReads <- struct{}{}
	}
	before := gets.Load()
	if _, _, _, err := g.liveNodes(t.Context(), ns, "holder"); !errors.Is(err, errNodesShed) {
		t.Errorf("with every further read in flight: %v, want %v", err, errNodesShed)
	}
	if gets.Load() != before {
		t.Error("the shed read was made")
	}
	if got := count("exit_guard_live_read_retries_total", map[string]string{"cause": "shed"}); got != 1 {
		t.Errorf("further reads shed: %v, want 1", got)
	}
}

// beforeGet is a reader whose Gets call hook first, and fail with its error.
type beforeGet struct {
	client.Reader
	hook func() error
}

func (r beforeGet) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := r.hook(); err != nil {
		return err
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}
