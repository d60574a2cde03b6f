package webhook

import (
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// The Event's part of the shared checks (kinds_test.go): rows E1 to E12.
var _ = addKindTest(kindEvent, kindTest{
	cases:     eventDecisionCases,
	refusable: func(t *testing.T) facts { return eventFacts(t, tableWorkflow, argo.EventReasonWorkflowFailed) },
	review:    eventReviewOf,
	seeds:     eventSeeds,
})

// eventDecisionCases walks rows E1 to E12 of docs/decisions.md.
func eventDecisionCases() []decisionCase {
	wf := tableWorkflow
	event := func(reason string) func(*testing.T) facts {
		return func(t *testing.T) facts { return eventFacts(t, wf, reason) }
	}
	failed := event(argo.EventReasonWorkflowFailed)
	podEvent := func(t *testing.T) facts {
		ev := fixture.WorkflowEvent(wf, argo.EventReasonWorkflowFailed, "x")
		ev.InvolvedObject.Kind, ev.InvolvedObject.APIVersion = "Pod", "v1"
		_, f, resp := readEventReview(reviewBody(admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create,
			Resource: eventResource, Object: runtime.RawExtension{Raw: fixture.JSON(ev)}}))
		if resp != nil {
			t.Fatal(resp.Result)
		}
		return f
	}
	elsewhereEvent := func(t *testing.T) facts { f := failed(t); f.namespace = "elsewhere"; return f }
	watchOnly := Options{Namespaces: []string{"argo"}}
	completion := Options{StoreFallback: FallbackCompletion}
	tombstone := Options{StoreFallback: FallbackTombstone}

	return []decisionCase{
		{row: "E1", name: "an Event about a pod", facts: podEvent, reason: contract.ReasonNotOwnedByWorkflow},
		{row: "E2", name: "an Event in a namespace not guarded", facts: elsewhereEvent, opts: watchOnly, reason: contract.ReasonNamespaceNotWatched},
		{row: "E3", name: "WorkflowRunning", facts: event("WorkflowRunning"), reason: contract.ReasonNotAFailureClaim},
		{row: "E3", name: "WorkflowSucceeded", facts: event("WorkflowSucceeded"), reason: contract.ReasonNotAFailureClaim},
		{row: "E3", name: "WorkflowTimedOut: recorded in passes that end running too", facts: event("WorkflowTimedOut"), reason: contract.ReasonNotAFailureClaim},
		{row: "E3", name: "the guard's own ExitHandlerDenied", facts: event(contract.EventReasonDenied), reason: contract.ReasonNotAFailureClaim},
		{row: "E4", name: "WorkflowFailed, live Succeeded", facts: failed, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowSucceeded, source: sourceLive},
		{row: "E4", name: "WorkflowFailed, live Succeeded, whatever the deny phases", facts: failed, opts: Options{DenyPhases: []argo.Phase{argo.PhaseFailed}}, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowSucceeded, source: sourceLive},
		{row: "E5", name: "WorkflowFailed, live Running (the failure's own write not landed yet)", facts: failed, live: liveRunning, store: storeSucceeded, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive},
		{row: "E5", name: "WorkflowFailed, live empty phase (v4 retry)", facts: failed, live: liveUnknown, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive},
		{row: "E6", name: "WorkflowFailed, live Failed: the claim is true", facts: failed, live: liveFailed, reason: contract.ReasonClaimMatchesPhase, source: sourceLive},
		{row: "E6", name: "WorkflowFailed, live Failed, Failed in the deny phases", facts: failed, opts: Options{DenyPhases: []argo.Phase{argo.PhaseSucceeded, argo.PhaseFailed}}, live: liveFailed, reason: contract.ReasonClaimMatchesPhase, source: sourceLive},
		{row: "E7", name: "WorkflowFailed, live 404, tombstone Succeeded", facts: failed, live: live404, store: storeSucceededTombstone, deny: true, reason: contract.ReasonWorkflowSucceeded, source: sourceStore},
		{row: "E7", name: "WorkflowFailed, live other UID, tombstone Succeeded", facts: failed, live: liveOtherUID, store: storeSucceededTombstone, deny: true, reason: contract.ReasonWorkflowSucceeded, source: sourceStore},
		{row: "E8", name: "WorkflowFailed, live 404, no record (deleted by a TTL before its Event landed)", facts: failed, live: live404, reason: contract.ReasonWorkflowGone, source: sourceLive},
		{row: "E8", name: "WorkflowFailed, live 404, store Succeeded but no tombstone", facts: failed, live: live404, store: storeSucceeded, reason: contract.ReasonWorkflowGone, source: sourceLive},
		{row: "E8", name: "WorkflowFailed, live other UID, tombstone of a running workflow", facts: failed, live: liveOtherUID, store: storeTombstone, reason: contract.ReasonWorkflowGone, source: sourceLive},
		{row: "E9", name: "WorkflowFailed, read fails, tombstone Succeeded", facts: failed, live: liveFails, store: storeSucceededTombstone, deny: true, reason: contract.ReasonWorkflowSucceeded, source: sourceStore},
		{row: "E10", name: "WorkflowFailed, read times out, store Succeeded, watch fresh (default fallback)", facts: failed, live: liveTimesOut, store: storeSucceeded, deny: true, reason: contract.ReasonWorkflowSucceeded, source: sourceStore},
		{row: "E10", name: "WorkflowFailed, read times out, store Succeeded, watch quiet past fresh-for", facts: failed, live: liveTimesOut, store: storeSucceeded, staleWatch: true, reason: contract.ReasonUnconfirmedCompletion, source: sourceStore},
		{row: "E10", name: "WorkflowFailed, read fails, store Succeeded, tombstone fallback", facts: failed, opts: tombstone, live: liveFails, store: storeSucceeded, reason: contract.ReasonUnconfirmedCompletion, source: sourceStore},
		{row: "E10", name: "WorkflowFailed, read fails, store Succeeded, completion fallback", facts: failed, opts: completion, live: liveFails, store: storeSucceeded, deny: true, reason: contract.ReasonWorkflowSucceeded, source: sourceStore},
		{row: "E11", name: "WorkflowFailed, read fails, store Running", facts: failed, live: liveFails, store: storeRunning, reason: contract.ReasonWorkflowNotTerminal, source: sourceStore},
		{row: "E11", name: "WorkflowFailed, read fails, store Failed", facts: failed, live: liveFails, store: storeFailed, reason: contract.ReasonClaimMatchesPhase, source: sourceStore},
		{row: "E11", name: "WorkflowFailed, read fails, store unsettled", facts: failed, opts: completion, live: liveFails, store: storeUnsettled, reason: contract.ReasonUnverifiedFailOpen, source: sourceStore},
		{row: "E11", name: "WorkflowFailed, read fails, tombstone of a running workflow", facts: failed, opts: completion, live: liveFails, store: storeTombstone, reason: contract.ReasonWorkflowGone, source: sourceStore},
		{row: "E12", name: "WorkflowFailed, read times out, store empty", facts: failed, live: liveTimesOut, reason: contract.ReasonUnverifiedFailOpen},
	}
}

// eventSeeds are reviews of Events for FuzzAdmissionReview: a failure claim of each workflow,
// created and updated, and Events of other shapes.
func eventSeeds(*testing.F) [][]byte {
	var seeds [][]byte
	for _, wf := range [][2]string{{"done", "uid-done"}, {"running", "uid-running"}, {"gone", "uid-gone"}} {
		ev := `{"metadata":{"name":"` + wf[0] + `.1"},"involvedObject":{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"` + wf[0] + `","uid":"` + wf[1] + `","resourceVersion":"3"},"reason":"WorkflowFailed","type":"Warning"}`
		seeds = append(seeds, eventReviewOf(admissionv1.Create, []byte(ev)), eventReviewOf(admissionv1.Update, []byte(ev)))
	}
	return append(seeds, eventReviewOf(admissionv1.Create, []byte(`{"involvedObject":{"kind":"Pod"},"reason":"WorkflowFailed"}`)),
		eventReviewOf(admissionv1.Create, []byte(`{"involvedObject":null,"reason":7}`)))
}

// FuzzReadEvent feeds arbitrary Event objects to the Event path's decoder: it must never panic,
// and must either go on with facts or answer.
func FuzzReadEvent(f *testing.F) {
	f.Add([]byte(`{"metadata":{"name":"w.1"},"involvedObject":{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"w","uid":"u","resourceVersion":"3"},"reason":"WorkflowFailed","type":"Warning"}`))
	f.Add([]byte(`{"involvedObject":null,"reason":7}`))
	f.Add([]byte(`{"involvedObject":{"kind":"Pod"},"reason":"WorkflowFailed","message":""}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		body := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"f","resource":{"version":"v1","resource":"events"},"operation":"CREATE","object":` + string(raw) + `}}`)
		_, fa, resp := readEventReview(body)
		if err := checkRead(fa, resp); err != nil {
			t.Fatal(err)
		}
	})
}
