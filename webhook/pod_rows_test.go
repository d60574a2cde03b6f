package webhook

import (
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// The pod's part of the shared checks (kinds_test.go): its rows are the table's shared rows, 1
// to 19, decided by the workflow from row 5 on.
var _ = addKindTest(kindPod, kindTest{
	cases:     podDecisionCases,
	refusable: func(t *testing.T) facts { return podFacts(t, fixture.ExitPod(tableWorkflow)) },
	review:    reviewOf,
	seeds:     podSeeds,
})

// podDecisionCases walks rows 1 to 19 of docs/decisions.md.
func podDecisionCases() []decisionCase {
	wf := tableWorkflow
	pod := func(p any) func(*testing.T) facts { return func(t *testing.T) facts { return podFacts(t, p) } }
	exit, step, hook, agent := pod(fixture.ExitPod(wf)), pod(fixture.StepPod(wf)), pod(fixture.HookPod(wf)), pod(fixture.AgentPod(wf))
	plain := fixture.ExitPod(wf)
	plain.OwnerReferences = nil
	artGCTask := fixture.ExitPod(wf)
	artGCTask.OwnerReferences = []metav1.OwnerReference{{APIVersion: argo.GroupVersion.String(), Kind: "WorkflowArtifactGCTask", Name: "x", UID: "u", Controller: ptr.To(true)}}
	otherGroup := fixture.ExitPod(wf)
	otherGroup.OwnerReferences[0].APIVersion = "example.com/v1"
	notController := fixture.ExitPod(wf)
	notController.OwnerReferences[0].Controller = nil
	elsewhere := fixture.ExitPod(wf)
	elsewhere.Namespace = "elsewhere"
	watchOnly := Options{Namespaces: []string{"argo"}}
	storeFirst := Options{StoreFirst: true}
	completion := Options{StoreFallback: FallbackCompletion}
	tombstone := Options{StoreFallback: FallbackTombstone}

	return []decisionCase{
		{row: "1", name: "a plain pod", facts: pod(plain), reason: contract.ReasonNotOwnedByWorkflow},
		{row: "1", name: "owned by a WorkflowArtifactGCTask", facts: pod(artGCTask), reason: contract.ReasonNotOwnedByWorkflow},
		{row: "1", name: "a Workflow of another group", facts: pod(otherGroup), reason: contract.ReasonNotOwnedByWorkflow},
		{row: "1", name: "a Workflow owner that is not the controller", facts: pod(notController), reason: contract.ReasonNotOwnedByWorkflow},
		{row: "2", name: "an artifact-GC pod owned by the Workflow", facts: pod(fixture.ComponentPod(wf, "artifact-gc")), reason: contract.ReasonArtifactGCOrOtherComponent},
		{row: "3", name: "an exit handler in a namespace not guarded", facts: pod(elsewhere), opts: watchOnly, reason: contract.ReasonNamespaceNotWatched},
		{row: "4", name: "a step pod with --cover=exit-handlers,hooks", facts: step, opts: Options{Cover: Coverage{NoSteps: true}}, reason: contract.ReasonNotCoveredByPolicy},
		{row: "4", name: "a hook pod with --cover=exit-handlers,steps", facts: hook, opts: Options{Cover: Coverage{NoHooks: true}}, reason: contract.ReasonNotCoveredByPolicy},
		{row: "5", name: "live Running", facts: exit, live: liveRunning, store: storeSucceeded, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive},
		{row: "5", name: "live empty phase (v4 retry)", facts: exit, live: liveUnknown, store: storeSucceeded, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive},
		{row: "5", name: "agent pod, live Running", facts: agent, live: liveRunning, store: storeSucceeded, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive},
		{row: "6", name: "live Succeeded", facts: exit, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive},
		{row: "6", name: "agent pod, live Succeeded", facts: agent, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive},
		{row: "6", name: "hook pod by default, live Succeeded", facts: hook, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive},
		{row: "6", name: "live Failed, Failed denied", facts: exit, opts: Options{DenyPhases: []argo.Phase{argo.PhaseFailed}}, live: liveFailed, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive},
		{row: "7", name: "live Failed, default policy", facts: exit, live: liveFailed, store: storeFailed, reason: contract.ReasonPhaseNotDenied, source: sourceLive},
		{row: "8", name: "live 404", facts: exit, live: live404, deny: true, reason: contract.ReasonWorkflowDeleted, source: sourceLive},
		{row: "8", name: "agent pod, live 404", facts: agent, live: live404, deny: true, reason: contract.ReasonWorkflowDeleted, source: sourceLive},
		{row: "9", name: "live other UID", facts: exit, live: liveOtherUID, deny: true, reason: contract.ReasonWorkflowReplaced, source: sourceLive},
		{row: "10", name: "read fails, store tombstone", facts: exit, live: liveFails, store: storeTombstone, deny: true, reason: contract.ReasonWorkflowDeleted, source: sourceStore},
		{row: "11", name: "read fails, store Succeeded, watch fresh (default fallback)", facts: exit, live: liveFails, store: storeSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore},
		{row: "11", name: "read times out, store Succeeded, watch fresh (default fallback)", facts: exit, live: liveTimesOut, store: storeSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore},
		{row: "11", name: "agent pod, read fails, store Succeeded, watch fresh: a retry's agent pod comes at once, never refused from the store", facts: agent, live: liveFails, store: storeSucceeded, reason: contract.ReasonUnconfirmedCompletion, source: sourceStore},
		{row: "11", name: "agent pod, read fails, store Succeeded, completion fallback", facts: agent, opts: completion, live: liveFails, store: storeSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore},
		{row: "11", name: "read times out, store Succeeded, watch quiet past fresh-for (default fallback: Argo sends the pod again)", facts: exit, live: liveTimesOut, store: storeSucceeded, staleWatch: true, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore},
		{row: "11", name: "read times out, store Succeeded, watch quiet past fresh-for (fresh fallback)", facts: exit, opts: Options{StoreFallback: FallbackFresh}, live: liveTimesOut, store: storeSucceeded, staleWatch: true, reason: contract.ReasonUnconfirmedCompletion, source: sourceStore},
		{row: "11", name: "read fails, store Succeeded, tombstone fallback", facts: exit, opts: tombstone, live: liveFails, store: storeSucceeded, reason: contract.ReasonUnconfirmedCompletion, source: sourceStore},
		{row: "11", name: "read fails, store Succeeded, completion fallback", facts: exit, opts: completion, live: liveFails, store: storeSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore},
		{row: "11", name: "read times out, store Succeeded, watch quiet, completion fallback", facts: exit, opts: completion, live: liveTimesOut, store: storeSucceeded, staleWatch: true, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore},
		{row: "12", name: "read fails, store Failed", facts: exit, live: liveFails, store: storeFailed, reason: contract.ReasonPhaseNotDenied, source: sourceStore},
		{row: "13", name: "read fails, store Running", facts: exit, live: liveFails, store: storeRunning, reason: contract.ReasonWorkflowNotTerminal, source: sourceStore},
		{row: "14", name: "read fails, store unsettled, completion fallback", facts: exit, opts: completion, live: liveFails, store: storeUnsettled, reason: contract.ReasonUnverifiedFailOpen, source: sourceStore},
		{row: "14", name: "read times out, store unsettled", facts: exit, live: liveTimesOut, store: storeUnsettled, reason: contract.ReasonUnverifiedFailOpen, source: sourceStore},
		{row: "15", name: "read times out, store empty", facts: exit, live: liveTimesOut, reason: contract.ReasonUnverifiedFailOpen},
		{row: "15", name: "read fails, store empty", facts: exit, live: liveFails, reason: contract.ReasonUnverifiedFailOpen},
		{row: "16", name: "store-first, store empty", facts: exit, opts: storeFirst, reason: contract.ReasonNotSeenCompleted, source: sourceStore},
		{row: "16", name: "a step pod by default, store empty", facts: step, reason: contract.ReasonNotSeenCompleted, source: sourceStore},
		{row: "16", name: "step pod, store empty", facts: step, reason: contract.ReasonNotSeenCompleted, source: sourceStore},
		{row: "17", name: "store-first, store Running", facts: exit, opts: storeFirst, store: storeRunning, reason: contract.ReasonWorkflowNotTerminal, source: sourceStore},
		{row: "17", name: "store-first, store Failed", facts: exit, opts: storeFirst, store: storeFailed, reason: contract.ReasonPhaseNotDenied, source: sourceStore},
		{row: "18", name: "store-first, store Succeeded, live Running (a retry)", facts: exit, opts: storeFirst, store: storeSucceeded, live: liveRunning, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive, wantRow: "5"},
		{row: "18", name: "store-first, store Succeeded, live confirms", facts: exit, opts: storeFirst, store: storeSucceeded, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "18", name: "store-first, store tombstone, live 404", facts: exit, opts: storeFirst, store: storeTombstone, live: live404, deny: true, reason: contract.ReasonWorkflowDeleted, source: sourceLive, wantRow: "8"},
		{row: "18", name: "store-first, store unsettled, live Succeeded", facts: exit, opts: storeFirst, store: storeUnsettled, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "18", name: "store-first, store unsettled, live says not terminal", facts: exit, opts: storeFirst, store: storeUnsettled, live: liveUnknown, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive, wantRow: "5"},
		{row: "18", name: "a step pod by default, store Succeeded, read fails: Argo sends the pod again", facts: step, store: storeSucceeded, live: liveFails, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore, wantRow: "11"},
		{row: "18", name: "step pod, store Succeeded, read fails, default fallback: Argo sends the pod again", facts: step, store: storeSucceeded, live: liveFails, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore, wantRow: "11"},
		{row: "18", name: "step pod, store Succeeded, read fails, fresh fallback: a retry's steps come at once", facts: step, opts: Options{StoreFallback: FallbackFresh}, store: storeSucceeded, live: liveFails, reason: contract.ReasonUnconfirmedCompletion, source: sourceStore, wantRow: "11"},
		{row: "18", name: "step pod, store Succeeded, read fails, tombstone fallback", facts: step, opts: Options{StoreFallback: FallbackTombstone}, store: storeSucceeded, live: liveFails, reason: contract.ReasonUnconfirmedCompletion, source: sourceStore, wantRow: "11"},
		{row: "18", name: "step pod, store Succeeded, read fails, completion fallback", facts: step, opts: Options{StoreFallback: FallbackCompletion}, store: storeSucceeded, live: liveFails, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore, wantRow: "11"},
		{row: "19", name: "store-first, watch stale, live Succeeded", facts: exit, opts: storeFirst, staleWatch: true, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "19", name: "a step pod by default, watch stale, live Succeeded", facts: step, staleWatch: true, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "19", name: "step pod, watch stale, live Succeeded", facts: step, staleWatch: true, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "19", name: "store-first, watch stale, read fails, store empty", facts: exit, opts: storeFirst, staleWatch: true, live: liveFails, reason: contract.ReasonUnverifiedFailOpen, wantRow: "15"},
	}
}

// podSeeds are reviews of pods for FuzzAdmissionReview: Argo's own (testdata/argo-pods) in
// every operation, and owner references and labels of every odd shape.
func podSeeds(f *testing.F) [][]byte {
	var seeds [][]byte
	for _, pod := range argoPods(f) {
		for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update, admissionv1.Delete} {
			seeds = append(seeds, reviewOf(op, pod))
		}
	}
	return append(seeds,
		reviewOf(admissionv1.Create, []byte(`{"metadata":{"ownerReferences":[{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"done","uid":"uid-done","controller":true},{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"running","uid":"uid-running","controller":true}],"labels":{"workflows.argoproj.io/on-exit":"true"}}}`)),
		reviewOf(admissionv1.Create, []byte(`{"metadata":{"ownerReferences":[{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"gone","uid":"uid-gone","controller":true}],"annotations":{"workflows.argoproj.io/node-name":"gone.onExit"}}}`)),
		reviewOf(admissionv1.Create, []byte(`{"metadata":{"ownerReferences":null,"labels":{"":""}}}`)),
		reviewOf(admissionv1.Create, []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}`)))
}

// FuzzRead feeds arbitrary pod objects to the request decoder: it must never panic, and must
// either go on with metadata or answer.
func FuzzRead(f *testing.F) {
	for _, pod := range argoPods(f) {
		f.Add(pod)
	}
	f.Add([]byte(`{"metadata":{"name":"p","labels":{"workflows.argoproj.io/on-exit":"true"},"ownerReferences":[{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"w","uid":"u","controller":true}]}}`))
	f.Add([]byte(`{"metadata":null}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, raw []byte) {
		// The pod inside a review, as the API server would send it were raw a JSON value.
		body := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"f","resource":{"version":"v1","resource":"pods"},"operation":"CREATE","object":` + string(raw) + `}}`)
		_, f, resp := readPodReview(body)
		if (f.object == nil) == (resp == nil) {
			t.Fatalf("readPod returned facts %+v and response %v; want exactly one", f, resp)
		}
	})
}

// FuzzClassify builds pod metadata from arbitrary labels, annotations and owner references
// (missing, several, duplicated, not controllers, of other kinds) and decides it.
func FuzzClassify(f *testing.F) {
	for _, raw := range argoPods(f) {
		var pod corev1.Pod
		if err := json.Unmarshal(raw, &pod); err != nil {
			f.Fatal(err)
		}
		ref := pod.OwnerReferences[0]
		f.Add(pod.Annotations[argo.AnnotationNodeName], pod.Labels[argo.LabelOnExit], pod.Labels[argo.LabelComponent], ref.APIVersion, ref.Kind, ref.Name, string(ref.UID), 1, true)
	}
	f.Add("wf.onExit", "", "", "argoproj.io/v1alpha1", "Workflow", "done", "uid-done", 2, true)
	f.Add("wf.hooks.running", "", "", "argoproj.io/v1alpha1", "Workflow", "done", "uid-other", 1, true)
	f.Add("", "true", "agent", "argoproj.io", "Workflow", "", "", 0, false)
	f.Add("x.onExit[0](1).hooks.y", "", "", "/", "", "running", "uid-running", 3, false)
	g := fuzzGuard(f, Options{})
	f.Fuzz(func(t *testing.T, node, onExit, component, apiVersion, kind, name, uid string, refs int, controller bool) {
		meta := &metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{}, Annotations: map[string]string{argo.AnnotationNodeName: node}}
		if onExit != "" {
			meta.Labels[argo.LabelOnExit] = onExit
		}
		if component != "" {
			meta.Labels[argo.LabelComponent] = component
		}
		for i := range refs % 4 {
			c := controller && i%2 == 0
			meta.OwnerReferences = append(meta.OwnerReferences, metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid), Controller: &c})
		}
		facts := classify(meta)
		if o := facts.owner; o != nil && (o.Kind != argo.Kind || argo.GroupOf(o.APIVersion) != argo.Group || o.Controller == nil || !*o.Controller) {
			t.Fatalf("owner %+v is not a controlling Argo Workflow", o)
		}
		switch agent := component == argo.ComponentAgent; {
		case agent != (facts.role == roleAgent):
			t.Fatalf("role %s for component %q", facts.role, component)
		case !agent && (onExit != "" || strings.Contains(node, argo.OnExitMarker)) != (facts.role == roleExitHandler):
			t.Fatalf("role %s for on-exit label %q and node %q", facts.role, onExit, node)
		}
		d := g.decide(t.Context(), facts)
		if d.deny && (facts.owner == nil || (component != "" && component != argo.ComponentAgent)) {
			t.Fatalf("refused a pod the guard does not own: %+v", d)
		}
		if d.deny && d.reason == contract.ReasonWorkflowCompleted && (name != "done" || string(facts.owner.UID) != "uid-done") {
			t.Fatalf("refused as completed a pod whose workflow is not the Succeeded one: %+v", d)
		}
	})
}
