package webhook

import (
	"net"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
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

// TestDecisionTable checks every row of docs/decisions.md. Workflows live on the real API
// server; the live read is a real GET, against it or against an address that fails or hangs.
func TestDecisionTable(t *testing.T) {
	ns := newNamespace(t)
	scheme := testScheme(t)
	newReader := func(cfg *rest.Config) client.Reader {
		c, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	live := newReader(env.Config)
	failing := newReader(unreachableConfig(t, false))
	hanging := newReader(unreachableConfig(t, true))

	wfs := map[argo.Phase]*unstructured.Unstructured{}
	for _, p := range []argo.Phase{argo.PhaseUnknown, argo.PhaseRunning, argo.PhaseSucceeded, argo.PhaseFailed} {
		wfs[p] = createWorkflow(t, ns, "table-"+map[argo.Phase]string{"": "new", "Running": "running", "Succeeded": "succeeded", "Failed": "failed"}[p], p)
	}
	deletedWF := createWorkflow(t, ns, "table-deleted", argo.PhaseSucceeded)
	if err := env.Client.Delete(t.Context(), deletedWF); err != nil {
		t.Fatal(err)
	}
	replaced := createWorkflow(t, ns, "table-replaced", argo.PhaseSucceeded)
	oldUID := replaced.GetUID()
	if err := env.Client.Delete(t.Context(), replaced); err != nil {
		t.Fatal(err)
	}
	replaced = createWorkflow(t, ns, "table-replaced", argo.PhaseRunning)
	replaced.SetUID(oldUID) // pods of the first one still name its UID
	// Workflows whose labels do not settle the phase: the live read GETs the whole object.
	retriedV4 := createWorkflow(t, ns, "table-retried-v4", argo.PhaseSucceeded)
	setPhase(t, retriedV4, argo.PhaseUnknown) // status.phase "", completed removed, phase label stale
	daemon := createWorkflow(t, ns, "table-daemon", argo.PhaseSucceeded)
	labels := daemon.GetLabels()
	labels[argo.LabelCompleted] = "false" // 3.4 with daemon steps: the phase before the label
	daemon.SetLabels(labels)
	if err := env.Client.Update(t.Context(), daemon); err != nil {
		t.Fatal(err)
	}
	// Labels that say Succeeded over a status that says Running: Argo never writes this, and
	// the status wins (a refusal is decided from the status only).
	labelsOnly := createWorkflow(t, ns, "table-labels-only", argo.PhaseRunning)
	labels = labelsOnly.GetLabels()
	labels[argo.LabelPhase], labels[argo.LabelCompleted] = string(argo.PhaseSucceeded), "true"
	labelsOnly.SetLabels(labels)
	if err := env.Client.Update(t.Context(), labelsOnly); err != nil {
		t.Fatal(err)
	}

	type storeState int
	const (
		storeEmpty storeState = iota
		storeRunning
		storeSucceeded
		storeFailed
		storeTombstone
		storeUnsettled // seen by the metadata watch, labels that do not settle the phase
	)
	yes := true
	podOf := func(wf *unstructured.Unstructured, kind podKind) *metav1.ObjectMeta {
		var p *corev1.Pod
		switch kind {
		case kindExitHandler:
			p = exitPod(wf)
		case kindHook:
			p = argoPod(wf, wf.GetName()+"-hook", wf.GetName()+".hooks.running", false)
		default:
			p = argoPod(wf, wf.GetName()+"-main", wf.GetName(), false)
		}
		return &p.ObjectMeta
	}
	notOwned := &metav1.ObjectMeta{Namespace: ns, Name: "plain", Labels: map[string]string{argo.LabelOnExit: "true"}}
	artGC := &metav1.ObjectMeta{Namespace: ns, Name: "artgc", OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "argoproj.io/v1alpha1", Kind: "WorkflowArtifactGCTask", Name: "x", UID: "u", Controller: &yes}}}
	agentOf := func(wf *unstructured.Unstructured, component string) *metav1.ObjectMeta {
		p := argoPod(wf, wf.GetName()+"-1340600742-agent", "", false)
		delete(p.Annotations, argo.AnnotationNodeName)
		p.Labels[argo.LabelComponent] = component
		return &p.ObjectMeta
	}
	agent := agentOf(wfs[argo.PhaseSucceeded], argo.ComponentAgent)
	agentOfRunning := agentOf(wfs[argo.PhaseRunning], argo.ComponentAgent)
	agentOfDeleted := agentOf(deletedWF, argo.ComponentAgent)
	artGCOfWorkflow := agentOf(wfs[argo.PhaseSucceeded], "artifact-gc")
	otherNS := podOf(wfs[argo.PhaseSucceeded], kindExitHandler)
	otherNS.Namespace = "elsewhere"
	// WorkflowTaskSet writes, read from AdmissionReviews as the webhook reads them.
	onExit := func(wf client.Object) string { return argo.NodeID(wf.GetName(), argo.OnExitNodeName(wf.GetName())) }
	stale := func(wf client.Object) *facts {
		return taskSetWrite(t, wf, []string{}, "true", []string{onExit(wf)}, "false")
	}
	cleanup := taskSetWrite(t, wfs[argo.PhaseSucceeded], []string{onExit(wfs[argo.PhaseSucceeded])}, "false", nil, "true")
	reopenOnly := taskSetWrite(t, wfs[argo.PhaseSucceeded], []string{}, "true", nil, "false")
	createFor := func(wf client.Object) *facts { return taskSetWrite(t, wf, nil, "", []string{onExit(wf)}, "false") }
	notOwnedTaskSet := stale(wfs[argo.PhaseSucceeded])
	notOwnedTaskSet.owner = nil
	otherNSTaskSet := stale(wfs[argo.PhaseSucceeded])
	otherNSTaskSet.namespace = "elsewhere"

	rows := []struct {
		row string
		pod *metav1.ObjectMeta
		// write, when set, is a WorkflowTaskSet write instead of a pod.
		write  *facts
		opts   Options
		reader client.Reader
		store  storeState
		deny   bool
		reason reason
		source source
		// staleWatch: the guard's watch has not advanced for longer than WatchStaleAfter.
		staleWatch bool
	}{
		{row: "1 not owned by a Workflow", pod: notOwned, reason: reasonNotWorkflowPod},
		{row: "1 owned by a WorkflowArtifactGCTask", pod: artGC, reason: reasonNotWorkflowPod},
		{row: "2 artifact-GC pod owned by the Workflow", pod: artGCOfWorkflow, reason: reasonSpecialPod},
		{row: "6 agent pod, live Succeeded", pod: agent, deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "5 agent pod, live Running", pod: agentOfRunning, store: storeSucceeded, reason: reasonWorkflowActive, source: sourceLive},
		{row: "11 agent pod, read fails, store Succeeded, default fallback", pod: agentOfRunning, reader: failing, store: storeSucceeded, reason: reasonUnconfirmedCompletion, source: sourceStore},
		{row: "8 agent pod, live 404", pod: agentOfDeleted, deny: true, reason: reasonWorkflowDeleted, source: sourceLive},
		{row: "3 namespace not guarded", pod: otherNS, opts: Options{Namespaces: []string{ns}}, reason: reasonNamespaceNotWatched},
		{row: "4 step pod without strict", pod: podOf(wfs[argo.PhaseSucceeded], kindStep), reason: reasonNotCovered},
		{row: "4 hook pod without cover-hooks", pod: podOf(wfs[argo.PhaseSucceeded], kindHook), reason: reasonNotCovered},
		{row: "5 live Running", pod: podOf(wfs[argo.PhaseRunning], kindExitHandler), store: storeSucceeded, reason: reasonWorkflowActive, source: sourceLive},
		{row: "5 live empty phase (v4 retry)", pod: podOf(wfs[argo.PhaseUnknown], kindExitHandler), store: storeSucceeded, reason: reasonWorkflowActive, source: sourceLive},
		{row: "6 live Succeeded", pod: podOf(wfs[argo.PhaseSucceeded], kindExitHandler), deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "5 live, retried by v4: stale Succeeded phase label, status.phase empty", pod: podOf(retriedV4, kindExitHandler), store: storeSucceeded, reason: reasonWorkflowActive, source: sourceLive},
		{row: "5 live, labels say Succeeded, status.phase Running: the status decides", pod: podOf(labelsOnly, kindExitHandler), reason: reasonWorkflowActive, source: sourceLive},
		{row: "6 live, daemon steps: Succeeded before the completed label", pod: podOf(daemon, kindExitHandler), deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "12 read fails, store unsettled", pod: podOf(wfs[argo.PhaseRunning], kindExitHandler), opts: Options{StoreFallback: FallbackCompletion}, reader: failing, store: storeUnsettled, reason: reasonUnverified, source: sourceStore},
		{row: "17 store-first, store unsettled, live confirms Succeeded", pod: podOf(daemon, kindExitHandler), opts: Options{StoreFirst: true}, store: storeUnsettled, deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "17 store-first, store unsettled, live says not terminal", pod: podOf(retriedV4, kindExitHandler), opts: Options{StoreFirst: true}, store: storeUnsettled, reason: reasonWorkflowActive, source: sourceLive},
		{row: "6 live Succeeded, hook pod with cover-hooks", pod: podOf(wfs[argo.PhaseSucceeded], kindHook), opts: Options{Hooks: true}, deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "7 live Failed, default policy", pod: podOf(wfs[argo.PhaseFailed], kindExitHandler), store: storeFailed, reason: reasonPhaseAllowed, source: sourceLive},
		{row: "6 live Failed, Failed denied", pod: podOf(wfs[argo.PhaseFailed], kindExitHandler), opts: Options{DenyPhases: []argo.Phase{argo.PhaseFailed}}, deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "8 live 404", pod: podOf(deletedWF, kindExitHandler), deny: true, reason: reasonWorkflowDeleted, source: sourceLive},
		{row: "9 live other UID", pod: podOf(replaced, kindExitHandler), deny: true, reason: reasonWorkflowReplaced, source: sourceLive},
		{row: "10 read fails, store tombstone", pod: podOf(wfs[argo.PhaseRunning], kindExitHandler), reader: failing, store: storeTombstone, deny: true, reason: reasonWorkflowDeleted, source: sourceStore},
		{row: "11 read fails, store Succeeded, default fallback", pod: podOf(wfs[argo.PhaseRunning], kindExitHandler), reader: failing, store: storeSucceeded, reason: reasonUnconfirmedCompletion, source: sourceStore},
		{row: "11 read times out, store Succeeded, default fallback", pod: podOf(wfs[argo.PhaseRunning], kindExitHandler), reader: hanging, store: storeSucceeded, reason: reasonUnconfirmedCompletion, source: sourceStore},
		{row: "11 read fails, store Succeeded, completion fallback", pod: podOf(wfs[argo.PhaseRunning], kindExitHandler), opts: Options{StoreFallback: FallbackCompletion}, reader: failing, store: storeSucceeded, deny: true, reason: reasonWorkflowCompleted, source: sourceStore},
		{row: "11 read times out, store Succeeded, completion fallback", pod: podOf(wfs[argo.PhaseRunning], kindExitHandler), opts: Options{StoreFallback: FallbackCompletion}, reader: hanging, store: storeSucceeded, deny: true, reason: reasonWorkflowCompleted, source: sourceStore},
		{row: "12 read fails, store Failed", pod: podOf(wfs[argo.PhaseRunning], kindExitHandler), reader: failing, store: storeFailed, reason: reasonPhaseAllowed, source: sourceStore},
		{row: "13 read fails, store Running", pod: podOf(wfs[argo.PhaseSucceeded], kindExitHandler), reader: failing, store: storeRunning, reason: reasonWorkflowActive, source: sourceStore},
		{row: "14 read times out, store empty", pod: podOf(wfs[argo.PhaseSucceeded], kindExitHandler), reader: hanging, reason: reasonUnverified},
		{row: "15 store-first, store empty", pod: podOf(wfs[argo.PhaseSucceeded], kindExitHandler), opts: Options{StoreFirst: true}, reader: failing, reason: reasonNotSeenCompleted, source: sourceStore},
		{row: "15 strict step pod, store empty", pod: podOf(wfs[argo.PhaseSucceeded], kindStep), opts: Options{Strict: true}, reader: failing, reason: reasonNotSeenCompleted, source: sourceStore},
		{row: "16 store-first, store Running", pod: podOf(wfs[argo.PhaseSucceeded], kindExitHandler), opts: Options{StoreFirst: true}, reader: failing, store: storeRunning, reason: reasonWorkflowActive, source: sourceStore},
		{row: "16 store-first, store Failed", pod: podOf(wfs[argo.PhaseFailed], kindExitHandler), opts: Options{StoreFirst: true}, reader: failing, store: storeFailed, reason: reasonPhaseAllowed, source: sourceStore},
		{row: "18 store-first, watch stale, live Succeeded", pod: podOf(wfs[argo.PhaseSucceeded], kindExitHandler), opts: Options{StoreFirst: true}, staleWatch: true, deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "18 strict step pod, watch stale, live Succeeded", pod: podOf(wfs[argo.PhaseSucceeded], kindStep), opts: Options{Strict: true}, staleWatch: true, deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "18 store-first, watch stale, read fails, store empty", pod: podOf(wfs[argo.PhaseSucceeded], kindExitHandler), opts: Options{StoreFirst: true}, reader: failing, staleWatch: true, reason: reasonUnverified},
		{row: "17 store-first, store Succeeded, live says Running (a retry)", pod: podOf(wfs[argo.PhaseRunning], kindExitHandler), opts: Options{StoreFirst: true}, store: storeSucceeded, reason: reasonWorkflowActive, source: sourceLive},
		{row: "17 store-first, store Succeeded, live confirms", pod: podOf(wfs[argo.PhaseSucceeded], kindExitHandler), opts: Options{StoreFirst: true}, store: storeSucceeded, deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "17 strict step pod, store Succeeded, read fails, default fallback", pod: podOf(wfs[argo.PhaseSucceeded], kindStep), opts: Options{Strict: true}, reader: failing, store: storeSucceeded, reason: reasonUnconfirmedCompletion, source: sourceStore},
		{row: "T1 TaskSet without a Workflow owner reference", write: notOwnedTaskSet, reason: reasonNotWorkflowPod},
		{row: "T2 TaskSet, namespace not guarded", write: otherNSTaskSet, opts: Options{Namespaces: []string{ns}}, reason: reasonNamespaceNotWatched},
		{row: "T3 TaskSet cleanup of a succeeded workflow (tasks removed, completed set)", write: cleanup, reader: failing, reason: reasonNoNewTask},
		{row: "T4 as 5: TaskSet task added, live Running", write: stale(wfs[argo.PhaseRunning]), store: storeSucceeded, reason: reasonWorkflowActive, source: sourceLive},
		{row: "T4 as 6: TaskSet task added, live Succeeded", write: stale(wfs[argo.PhaseSucceeded]), deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "T4 as 6: TaskSet completed set back alone, live Succeeded", write: reopenOnly, deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "T4 as 6: TaskSet created, live Succeeded", write: createFor(wfs[argo.PhaseSucceeded]), deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "T4 as 7: TaskSet task added, live Failed, default policy", write: stale(wfs[argo.PhaseFailed]), reason: reasonPhaseAllowed, source: sourceLive},
		{row: "T4 as 8: TaskSet created, live 404", write: createFor(deletedWF), deny: true, reason: reasonWorkflowDeleted, source: sourceLive},
		{row: "T4 as 9: TaskSet task added, live other UID", write: stale(replaced), deny: true, reason: reasonWorkflowReplaced, source: sourceLive},
		{row: "T4 as 10: TaskSet task added, read fails, store tombstone", write: stale(wfs[argo.PhaseRunning]), reader: failing, store: storeTombstone, deny: true, reason: reasonWorkflowDeleted, source: sourceStore},
		{row: "T4 as 11: TaskSet task added, read times out, store Succeeded", write: stale(wfs[argo.PhaseRunning]), reader: hanging, store: storeSucceeded, reason: reasonUnconfirmedCompletion, source: sourceStore},
		{row: "T4 as 11: TaskSet task added, read fails, store Succeeded, completion fallback", write: stale(wfs[argo.PhaseRunning]), opts: Options{StoreFallback: FallbackCompletion}, reader: failing, store: storeSucceeded, deny: true, reason: reasonWorkflowCompleted, source: sourceStore},
		{row: "T4 as 14: TaskSet task added, read fails, store empty", write: stale(wfs[argo.PhaseSucceeded]), reader: failing, reason: reasonUnverified},
		{row: "T4 as 15: TaskSet task added, store-first, store empty", write: stale(wfs[argo.PhaseSucceeded]), opts: Options{StoreFirst: true}, reader: failing, reason: reasonNotSeenCompleted, source: sourceStore},
		{row: "T4 as 17: TaskSet task added, store-first, store Succeeded, live confirms", write: stale(wfs[argo.PhaseSucceeded]), opts: Options{StoreFirst: true}, store: storeSucceeded, deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "T4 as 18: TaskSet task added, store-first, watch stale, live Succeeded", write: stale(wfs[argo.PhaseSucceeded]), opts: Options{StoreFirst: true}, staleWatch: true, deny: true, reason: reasonWorkflowCompleted, source: sourceLive},
		{row: "17 strict step pod, store Succeeded, read fails, completion fallback", pod: podOf(wfs[argo.PhaseSucceeded], kindStep), opts: Options{Strict: true, StoreFallback: FallbackCompletion}, reader: failing, store: storeSucceeded, deny: true, reason: reasonWorkflowCompleted, source: sourceStore},
	}
	for _, r := range rows {
		t.Run(r.row, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			store, err := completionstore.New(completionstore.Options{Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			store.Progress("1")
			if r.staleWatch {
				clk.Step(time.Hour)
			}
			var ref *metav1.OwnerReference
			var namespace string
			if r.write != nil {
				ref, namespace = r.write.owner, r.write.namespace
			} else {
				ref, namespace = metav1.GetControllerOfNoCopy(r.pod), r.pod.Namespace
			}
			if ref != nil && r.store != storeEmpty {
				o := completionstore.Observation{UID: ref.UID, Namespace: namespace, Name: ref.Name, ResourceVersion: "1"}
				switch r.store {
				case storeRunning:
					o.Phase = argo.PhaseRunning
				case storeSucceeded:
					o.Phase = argo.PhaseSucceeded
				case storeFailed:
					o.Phase = argo.PhaseFailed
				case storeTombstone:
					o.Phase, o.Deleted = argo.PhaseRunning, true
				case storeUnsettled:
					o.Phase = argo.PhaseUnsettled
				}
				store.Observe(o)
			}
			reader := r.reader
			if reader == nil {
				reader = live
			}
			r.opts.LiveReadTimeout, r.opts.LiveReadBudget = 300*time.Millisecond, time.Second
			g, err := newGuard(reader, store, r.opts)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var d decision
			if r.write != nil {
				d = g.decideTaskSet(t.Context(), *r.write)
			} else {
				_, d = g.decide(t.Context(), r.pod)
			}
			if d.deny != r.deny || d.reason != r.reason || d.source != r.source {
				t.Errorf("decision = deny %v reason %s source %q, want deny %v reason %s source %q (live error: %v)",
					d.deny, d.reason, d.source, r.deny, r.reason, r.source, d.liveErr)
			}
			if r.reader == hanging && time.Since(start) > 5*time.Second {
				t.Errorf("a hanging live read held the decision %s, past any webhook timeout", time.Since(start))
			}
		})
	}
}

// taskSetWrite reads a WorkflowTaskSet write of wf's TaskSet as the webhook does: from an
// AdmissionReview with the object before (nil oldTasks: a CREATE) and after.
func taskSetWrite(t *testing.T, wf client.Object, oldTasks []string, oldCompleted string, newTasks []string, newCompleted string) *facts {
	t.Helper()
	object := func(tasks []string, completed string) runtime.RawExtension {
		m := map[string]any{}
		for _, k := range tasks {
			m[k] = httpTask(k)
		}
		ts := taskSetOf(wf, m)
		ts.SetLabels(map[string]string{argo.LabelCompleted: completed})
		return runtime.RawExtension{Raw: mustJSON(ts.Object)}
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "u", Operation: admissionv1.Create, Namespace: wf.GetNamespace(), Name: wf.GetName(),
		Resource: taskSetResource, Object: object(newTasks, newCompleted),
	}}
	if oldTasks != nil {
		req.Operation, req.OldObject = admissionv1.Update, object(oldTasks, oldCompleted)
	}
	f, resp := readTaskSet(req)
	if resp != nil {
		t.Fatalf("reading a TaskSet write: answered %v", resp.Result)
	}
	return &f
}

func TestClassify(t *testing.T) {
	yes := true
	owner := []metav1.OwnerReference{{APIVersion: "argoproj.io/v1alpha1", Kind: "Workflow", Name: "wf", UID: types.UID("u"), Controller: &yes}}
	tests := []struct {
		name      string
		meta      metav1.ObjectMeta
		wantKind  podKind
		wantOwned bool
	}{
		{"the on-exit label marks an exit handler", metav1.ObjectMeta{Labels: map[string]string{argo.LabelOnExit: "true"}, OwnerReferences: owner}, kindExitHandler, true},
		{"the label counts whatever its value", metav1.ObjectMeta{Labels: map[string]string{argo.LabelOnExit: "false"}, OwnerReferences: owner}, kindExitHandler, true},
		{"an onExit node name alone marks an exit handler", metav1.ObjectMeta{Annotations: map[string]string{argo.AnnotationNodeName: "wf[0].step-1.onExit"}, OwnerReferences: owner}, kindExitHandler, true},
		{"a hooks node is a lifecycle hook", metav1.ObjectMeta{Annotations: map[string]string{argo.AnnotationNodeName: "wf.hooks.running"}, OwnerReferences: owner}, kindHook, true},
		{"anything else is a step", metav1.ObjectMeta{Annotations: map[string]string{argo.AnnotationNodeName: "wf[0].a"}, OwnerReferences: owner}, kindStep, true},
		{"a Workflow of another group is not Argo's", metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Workflow", Name: "wf", Controller: &yes}}}, kindStep, false},
		{"a non-controller owner reference does not count", metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{APIVersion: "argoproj.io/v1alpha1", Kind: "Workflow", Name: "wf"}}}, kindStep, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := classify(&tt.meta)
			if f.kind != tt.wantKind || (f.owner != nil) != tt.wantOwned {
				t.Errorf("classify = kind %s owned %v, want %s %v", f.kind, f.owner != nil, tt.wantKind, tt.wantOwned)
			}
		})
	}
}

// The live read answers from the API server's watch cache (a LIST by name), yet it must never
// return an older state than the newest write: each read right after a write sees that write.
func TestLiveReadSeesTheNewestWrite(t *testing.T) {
	ns := newNamespace(t)
	c, err := client.New(env.Config, client.Options{Scheme: testScheme(t)})
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
		got, err := g.liveRead(t.Context(), ns, wf.GetName())
		if err != nil {
			t.Fatal(err)
		}
		if got.ResourceVersion != wf.GetResourceVersion() || got.Status.Phase != phase {
			t.Fatalf("write %d of %d: the live read returned resourceVersion %s phase %s, want the write's %s %s",
				i+1, writes, got.ResourceVersion, got.Status.Phase, wf.GetResourceVersion(), phase)
		}
	}
}
