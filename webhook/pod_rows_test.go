package webhook

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
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

// argoNode builds a node name the way Argo's controller does, from a path of operations, and
// says which role Argo gives the node's pod: the oracle of FuzzClassify, independent of
// classify. Each byte of path is one step down the node tree (its low 3 bits the kind, the rest
// the name or index):
//   - a steps group's child: <parent>[i].<step> (executeSteps);
//   - a DAG task: <parent>.<task> (executeDAG; a task of the entrypoint DAG is <wf>.<task>);
//   - an exit handler: GenerateOnExitNodeName, <parent>.onExit (spec.onExit, hooks.exit, a
//     step's or task's onExit), after which Argo labels every pod on-exit;
//   - a lifecycle hook: <parent>.hooks.<name> (any key but exit; no label);
//   - a retry attempt: <parent>(n); a withItems or withParam expansion: <step>(i:item).
//
// Step and task names are Argo's valid names (no dot), some of them made to look like markers.
type argoNode struct {
	name string
	// inExit: under an exit handler; inHook: under a lifecycle hook and not an exit handler.
	inExit, inHook bool
	// hooksTask: a step or task named hooks has a child whose name starts with a dot, so the
	// node's name holds .hooks. without a hook: the one place where Argo's names do not tell
	// a hook from a step (InLifecycleHook takes it for a hook's).
	hooksTask bool
}

var argoNodeNames = []string{"main", "notify", "onExit", "onExitCleanup", "onExit-notify", "hooks", "hooks-x", "exit", "running", "on-exit"}

func buildArgoNode(workflow string, path []byte) argoNode {
	n := argoNode{name: workflow}
	lastHooks := false // the last element is a step or task named hooks
	for _, b := range path {
		name := argoNodeNames[int(b>>3)%len(argoNodeNames)]
		startsWithDot := false
		switch b & 7 {
		case 0, 1:
			n.name += fmt.Sprintf("[%d].%s", b>>6, name)
		case 2, 3:
			n.name += "." + name
			startsWithDot = true
		case 4:
			n.name += ".onExit"
			n.inExit, startsWithDot = true, true
		case 5:
			n.name += ".hooks." + name
			n.inHook, startsWithDot = !n.inExit, true
		case 6:
			n.name += fmt.Sprintf("(%d)", b>>3)
		case 7:
			n.name += fmt.Sprintf("(%d:%s)", b>>3, name)
		}
		if lastHooks && startsWithDot {
			n.hooksTask = true
		}
		lastHooks = (b&7 == 0 || b&7 == 1 || b&7 == 2 || b&7 == 3) && name == "hooks"
	}
	return n
}

// dnsName maps s onto a Kubernetes object name (DNS subdomain: lowercase letters, digits, '-'
// and '.'), so that a fuzzed workflow name is one Argo could have.
func dnsName(s string) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-."
	var b strings.Builder
	for i := range min(len(s), 63) {
		if strings.IndexByte(alphabet, s[i]) >= 0 {
			b.WriteByte(s[i])
			continue
		}
		b.WriteByte(alphabet[int(s[i])%len(alphabet)])
	}
	if b.Len() == 0 {
		return "wf"
	}
	return b.String()
}

// FuzzClassify builds a pod as Argo's controller would for a node built by Argo's naming
// (argoNode), under an arbitrary workflow name, with arbitrary other labels and owner references
// (missing, several, not controllers, of other kinds), and holds classify's role against the
// oracle's: an exit handler exactly when Argo labels it so (or the user's podMetadata sets the
// label, which Argo then reads too), a hook for every hook's pod, a step otherwise (a hook only
// where a step or task named hooks makes the names alike), never the exit handler's budget
// from a name. It then decides the pod.
func FuzzClassify(f *testing.F) {
	f.Add("done", []byte{4, 0}, "", "", "argoproj.io/v1alpha1", "Workflow", "uid-done", 1, true)
	f.Add("etl.hooks.daily", []byte{0, 8}, "", "", "argoproj.io/v1alpha1", "Workflow", "uid-done", 1, true)
	f.Add("wf", []byte{2 | 3<<3, 7 | 4<<3}, "", "", "argoproj.io/v1alpha1", "Workflow", "uid-done", 1, true) // DAG task onExitCleanup, withItems
	f.Add("wf", []byte{0 | 4<<3}, "", "", "argoproj.io/v1alpha1", "Workflow", "uid-done", 1, true)           // step onExit-notify
	f.Add("wf", []byte{5, 0, 6}, "", "", "argoproj.io/v1alpha1", "Workflow", "uid-running", 1, true)         // a hook's step, retried
	f.Add("wf", []byte{2 | 5<<3, 2}, "", "", "argoproj.io/v1alpha1", "Workflow", "uid-done", 2, true)        // a DAG task named hooks, nested
	f.Add("wf", []byte{}, "true", "agent", "argoproj.io", "Workflow", "", 0, false)
	f.Add("x", []byte{4, 5}, "", "", "/", "", "uid-running", 3, false)
	g := fuzzGuard(f, Options{})
	f.Fuzz(func(t *testing.T, wfName string, path []byte, userOnExit, component, apiVersion, kind, uid string, refs int, controller bool) {
		wfName = dnsName(wfName)
		node := buildArgoNode(wfName, path)
		meta := &metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{argo.LabelWorkflow: wfName}, Annotations: map[string]string{argo.AnnotationNodeName: node.name}}
		if node.inExit {
			meta.Labels[argo.LabelOnExit] = "true"
		}
		if userOnExit != "" {
			meta.Labels[argo.LabelOnExit] = userOnExit
		}
		if component != "" {
			meta.Labels[argo.LabelComponent] = component
		}
		for i := range refs % 4 {
			c := controller && i%2 == 0
			meta.OwnerReferences = append(meta.OwnerReferences, metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: wfName, UID: types.UID(uid), Controller: &c})
		}
		facts := classify(meta)
		if o := facts.owner; o != nil && (o.Kind != argo.Kind || argo.GroupOf(o.APIVersion) != argo.Group || o.Controller == nil || !*o.Controller) {
			t.Fatalf("owner %+v is not a controlling Argo Workflow", o)
		}
		var want []role
		switch {
		case component == argo.ComponentAgent:
			want = []role{roleAgent}
		case node.inExit || userOnExit != "":
			want = []role{roleExitHandler}
		case node.inHook:
			want = []role{roleHook}
		case node.hooksTask:
			want = []role{roleStep, roleHook}
		default:
			want = []role{roleStep}
		}
		if !slices.Contains(want, facts.role) {
			t.Fatalf("node %q of workflow %q (on-exit label %q, component %q): role %s, Argo's %v", node.name, wfName, meta.Labels[argo.LabelOnExit], component, facts.role, want)
		}
		d := g.decide(t.Context(), facts)
		if d.deny && (facts.owner == nil || (component != "" && component != argo.ComponentAgent)) {
			t.Fatalf("refused a pod the guard does not own: %+v", d)
		}
		if d.deny && d.reason == contract.ReasonWorkflowCompleted && (wfName != "done" || string(facts.owner.UID) != "uid-done") {
			t.Fatalf("refused as completed a pod whose workflow is not the Succeeded one: %+v", d)
		}
	})
}
