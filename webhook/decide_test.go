package webhook

import (
	"context"
	"crypto/sha256"
	"errors"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// decisionCase is one case of TestDecisionTable: the object, the options, what the live read
// answers and the store holds, and the decision wanted.
type decisionCase struct {
	// row is the row of docs/decisions.md the case is about, and name what it shows.
	row, name string
	facts     func(t *testing.T) facts
	opts      Options
	live      liveAnswer
	nodes     nodesAnswer
	// createdBy: the guard admitted a create of the TaskSet by that workflow, createdAgo
	// before the case, with the tasks the case's write adds (another task with
	// createdOtherTask).
	createdBy            types.UID
	createdAgo           time.Duration
	createdOtherTask     bool
	createdOtherTemplate bool
	// createdFromStore: that create was admitted from the store (rows 13, 17), not after a
	// live read.
	createdFromStore bool
	// createdWithout: that create lacked these tasks of the case's write.
	createdWithout []string
	// createdByOtherUser: that create was sent by another user than the case's write (another
	// tenant of the namespace; Argo's controller sends both).
	createdByOtherUser bool
	store              storeState
	// staleWatch: the guard's watch has not advanced for longer than WatchStaleAfter (and
	// than StoreFreshFor).
	staleWatch bool
	// The decision wanted; wantRow is the row that answers (row, unless the case's row sends
	// the object on to another).
	deny    bool
	reason  contract.Reason
	source  source
	wantRow string
}

// decisionCases walks docs/decisions.md row by row.
func decisionCases() []decisionCase {
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
	onExit := argo.NodeID(wf.GetName(), argo.OnExitNodeName(wf.GetName()))
	write := func(oldTasks []string, oldCompleted string, newTasks []string, newCompleted string) func(*testing.T) facts {
		return func(t *testing.T) facts { return taskSetFacts(t, wf, oldTasks, oldCompleted, newTasks, newCompleted) }
	}
	stale := write([]string{}, "true", []string{onExit}, "false")
	stepWrite := write([]string{}, "true", []string{argo.NodeID(wf.GetName(), wf.GetName()+"[0].call")}, "false")
	cleanup := write([]string{onExit}, "false", nil, "true")
	reopenOnly := write([]string{}, "true", nil, "false")
	// Argo's patch after AlreadyExists carries every pending task; the object may hold them
	// already (a deleted workflow's leftover keys), so that it only reopens.
	stepCall := argo.NodeID(wf.GetName(), wf.GetName()+"[0].call")
	reopenHeld := write([]string{stepCall}, "true", []string{stepCall}, "false")
	reopenHeldExit := write([]string{stepCall, onExit}, "true", []string{stepCall, onExit}, "false")
	created := write(nil, "", []string{onExit}, "false")
	notOwnedWrite := func(t *testing.T) facts { f := stale(t); f.owner = nil; return f }
	dryRun := func(of func(*testing.T) facts) func(*testing.T) facts {
		return func(t *testing.T) facts { f := of(t); f.dryRun = true; return f }
	}
	elsewhereWrite := func(t *testing.T) facts { f := stale(t); f.namespace = "elsewhere"; return f }
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
		{row: "T1", name: "TaskSet without a Workflow owner reference", facts: notOwnedWrite, reason: contract.ReasonNotOwnedByWorkflow},
		{row: "T2", name: "TaskSet, namespace not guarded", facts: elsewhereWrite, opts: watchOnly, reason: contract.ReasonNamespaceNotWatched},
		{row: "T3", name: "TaskSet cleanup of a succeeded workflow (tasks removed, completed set)", facts: cleanup, reason: contract.ReasonNoNewTask},
		{row: "T7", name: "TaskSet created again with the tasks and templates this replica admitted for the workflow after a live read 1 s before, the store holding it running (Argo's next pass: AlreadyExists)", facts: created, createdBy: wf.GetUID(), createdAgo: time.Second, store: storeRunning, reason: contract.ReasonRepeatsAdmittedCreate},
		{row: "T7", name: "TaskSet created again, dry run", facts: dryRun(created), createdBy: wf.GetUID(), createdAgo: time.Second, store: storeRunning, reason: contract.ReasonRepeatsAdmittedCreate},
		{row: "T4", name: "as 5: task added, live Running", facts: stale, live: liveRunning, store: storeSucceeded, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive, wantRow: "5"},
		{row: "T4", name: "as 6: task added, live Succeeded", facts: stale, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: completed set back alone, live Succeeded", facts: reopenOnly, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created, live Succeeded", facts: created, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created with a task the create admitted for the workflow lacked (a stale copy's exit handler), live Succeeded", facts: created, createdBy: wf.GetUID(), createdAgo: time.Second, createdOtherTask: true, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created with the task admitted for the workflow, another template, live Succeeded", facts: created, createdBy: wf.GetUID(), createdAgo: time.Second, createdOtherTemplate: true, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created as admitted for the workflow, older than the repeat memory, live Succeeded", facts: created, createdBy: wf.GetUID(), createdAgo: DefaultOptions().TaskSetRepeatsFor + time.Second, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created as admitted for the workflow from the store (no live read), live Succeeded", facts: created, createdBy: wf.GetUID(), createdAgo: time.Second, createdFromStore: true, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created as admitted for the workflow 1 s before, the store since saw it succeed, live Succeeded", facts: created, createdBy: wf.GetUID(), createdAgo: time.Second, store: storeSucceeded, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 9: TaskSet created as admitted for the workflow 1 s before, the store since saw it deleted (its name reused), live other UID", facts: created, createdBy: wf.GetUID(), createdAgo: time.Second, store: storeTombstone, live: liveOtherUID, deny: true, reason: contract.ReasonWorkflowReplaced, source: sourceLive, wantRow: "9"},
		{row: "T4", name: "as 15: TaskSet created as admitted for the workflow 1 s before, the store holding nothing of it, read fails", facts: created, createdBy: wf.GetUID(), createdAgo: time.Second, live: liveFails, reason: contract.ReasonUnverifiedFailOpen, wantRow: "15"},
		{row: "T4", name: "as 6: TaskSet created again with the tasks and templates admitted for the workflow after a live read 1 s before, in a create another user sent, live Succeeded", facts: created, createdBy: wf.GetUID(), createdAgo: time.Second, createdByOtherUser: true, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created as admitted for another workflow of the name, live Succeeded", facts: created, createdBy: "uid-of-another", createdAgo: time.Second, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: task added by an update, a create of it admitted for the workflow 1 s before (the patch after AlreadyExists is judged), live Succeeded", facts: stale, createdBy: wf.GetUID(), createdAgo: time.Second, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 7: task added, live Failed, default policy", facts: stale, live: liveFailed, reason: contract.ReasonPhaseNotDenied, source: sourceLive, wantRow: "7"},
		{row: "T4", name: "as 8: TaskSet created, live 404", facts: created, live: live404, deny: true, reason: contract.ReasonWorkflowDeleted, source: sourceLive, wantRow: "8"},
		{row: "T4", name: "as 8: task added by an update, live 404", facts: stale, live: live404, deny: true, reason: contract.ReasonWorkflowDeleted, source: sourceLive, wantRow: "8"},
		{row: "T4", name: "as 9: TaskSet created, live other UID", facts: created, live: liveOtherUID, deny: true, reason: contract.ReasonWorkflowReplaced, source: sourceLive, wantRow: "9"},
		{row: "T4", name: "as 10: TaskSet created, read fails, store tombstone", facts: created, live: liveFails, store: storeTombstone, deny: true, reason: contract.ReasonWorkflowDeleted, source: sourceStore, wantRow: "10"},
		{row: "T4", name: "as 11: the exit handler's task added, read times out, store Succeeded, watch fresh", facts: stale, live: liveTimesOut, store: storeSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore, wantRow: "11"},
		{row: "T4", name: "as 11: another node's task added, read times out, store Succeeded, watch fresh: a retry's comes at once", facts: stepWrite, live: liveTimesOut, store: storeSucceeded, reason: contract.ReasonUnconfirmedCompletion, source: sourceStore, wantRow: "11"},
		{row: "T4", name: "as 11: task added, read times out, store Succeeded, tombstone fallback", facts: stale, opts: tombstone, live: liveTimesOut, store: storeSucceeded, reason: contract.ReasonUnconfirmedCompletion, source: sourceStore, wantRow: "11"},
		{row: "T4", name: "as 11: task added, read fails, store Succeeded, completion fallback", facts: stale, opts: completion, live: liveFails, store: storeSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceStore, wantRow: "11"},
		{row: "T4", name: "as 15: task added, read fails, store empty", facts: stale, live: liveFails, reason: contract.ReasonUnverifiedFailOpen, wantRow: "15"},
		{row: "T4", name: "as 16: task added, store-first, store empty", facts: stale, opts: storeFirst, reason: contract.ReasonNotSeenCompleted, source: sourceStore, wantRow: "16"},
		{row: "T4", name: "as 18: task added, store-first, store Succeeded, live confirms", facts: stale, opts: storeFirst, store: storeSucceeded, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 19: task added, store-first, watch stale, live Succeeded", facts: stale, opts: storeFirst, staleWatch: true, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T5", name: "owner's name held by another, its status lacks the task's node (its first pass, or a stale copy's task)", facts: stale, live: liveOtherUID, nodes: nodesNotWritten, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, whose node of the task has finished", facts: stale, live: liveOtherUID, nodes: nodesDone, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, whose node of that ID is a pod", facts: stepWrite, live: liveOtherUID, nodes: nodesOfPods, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, which has completed", facts: stale, live: liveOtherUID, nodes: nodesHolderDone, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, and by a third at the whole read", facts: stale, live: liveOtherUID, nodes: nodesAnotherHolder, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, whole read fails", facts: stale, live: liveOtherUID, nodes: nodesFail, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "update that only sets completed back, owner's name held by another", facts: reopenOnly, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "update that only sets completed back on tasks the object holds, owner's name held by another, its status lacks their nodes", facts: reopenHeld, live: liveOtherUID, nodes: nodesNotWritten, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "update that only sets completed back on tasks the object holds, one a leftover the name's holder did not create (the deleted workflow's exit handler)", facts: reopenHeldExit, live: liveOtherUID, createdBy: "uid-of-another", createdAgo: time.Second, createdWithout: []string{onExit}, nodes: nodesNotWritten, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "update of a TaskSet whose owner the store saw deleted, read fails", facts: stale, live: liveFails, store: storeTombstone, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceStore},
		{row: "T5", name: "owner's name held by another; a create with these tasks remembered, by a third", facts: stale, live: liveOtherUID, createdBy: "uid-of-a-third", nodes: nodesNotWritten, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another; a create with these tasks remembered for it, sent by another user (another tenant of the namespace)", facts: stale, live: liveOtherUID, createdBy: "uid-of-another", createdAgo: time.Second, createdByOtherUser: true, nodes: nodesNotWritten, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another; its create remembered, older than the memory", facts: stale, live: liveOtherUID, createdBy: "uid-of-another", createdAgo: createMemory + time.Second, nodes: nodesNotWritten, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another; its create remembered, with other tasks", facts: stale, live: liveOtherUID, createdBy: "uid-of-another", createdOtherTask: true, nodes: nodesNotWritten, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another; its create remembered, the same task with another template (a stale copy's own)", facts: stale, live: liveOtherUID, createdBy: "uid-of-another", createdOtherTemplate: true, nodes: nodesNotWritten, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another that has completed; its create remembered", facts: stale, live: liveOtherUIDDone, createdBy: "uid-of-another", createdAgo: time.Second, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, whose pending node of the task is in its exit handler (known only from a create)", facts: stale, live: liveOtherUID, nodes: nodesPendingExitHandler, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T6", name: "owner's name held by another, which created the TaskSet with these tasks just before (AlreadyExists, then this patch)", facts: stale, live: liveOtherUID, createdBy: "uid-of-another", createdAgo: time.Second, reason: contract.ReasonTasksOfNameHolder, source: sourceLive},
		{row: "T6", name: "owner's name held by another that runs, each task its pending HTTP node", facts: stepWrite, live: liveOtherUID, nodes: nodesPending, reason: contract.ReasonTasksOfNameHolder, source: sourceLive},
		{row: "T6", name: "update that only sets completed back on tasks the object holds, owner's name held by another, which created the TaskSet with them just before", facts: reopenHeld, live: liveOtherUID, createdBy: "uid-of-another", createdAgo: time.Second, reason: contract.ReasonTasksOfNameHolder, source: sourceLive},
		{row: "T6", name: "update that only sets completed back on tasks the object holds, owner's name held by another that runs, each its pending HTTP node", facts: reopenHeld, live: liveOtherUID, nodes: nodesPending, reason: contract.ReasonTasksOfNameHolder, source: sourceLive},
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

// TestDecisionTable checks every row of docs/decisions.md, in its order, on the facts the
// webhooks read from requests, with a live read that answers as each case says. The rows that
// are about the API server itself (what a live read sees, how it fails) are checked through a
// real one by TestLiveReadThroughTheAPIServer.
func TestDecisionTable(t *testing.T) {
	// seen are the (kind, reason) pairs the rows give: each kind's declared reasons (its metric
	// series) must be exactly those.
	seen := map[objectKind]map[contract.Reason]bool{}
	ran := 0
	cases := decisionCases()
	for _, c := range cases {
		t.Run(c.row+" "+c.name, func(t *testing.T) {
			ran++
			g, err := newGuard(nil, storeFor(t, tableWorkflow, c.store, c.staleWatch), c.opts)
			if err != nil {
				t.Fatal(err)
			}
			calls, nodeCalls := 0, 0
			g.readLive = cannedRead(c.live, &calls)
			f := c.facts(t)
			var tasks []string
			if ts, ok := f.object.(*taskSetObject); ok {
				tasks, _ = ts.handed()
			}
			g.readNodes = cannedNodes(c.nodes, tasks, &nodeCalls)
			if c.createdBy != "" {
				now := time.Now()
				g.creates.now = func() time.Time { return now.Add(-c.createdAgo) }
				ts := f.object.(*taskSetObject)
				_, handed := ts.handed()
				created := maps.Clone(handed)
				switch {
				case c.createdOtherTask:
					created = map[string][sha256.Size]byte{"another-task": {}}
				case c.createdWithout != nil:
					for _, k := range c.createdWithout {
						delete(created, k)
					}
				case c.createdOtherTemplate:
					for k := range created {
						created[k] = sha256.Sum256([]byte("another template"))
					}
				}
				requester := f.requester
				if c.createdByOtherUser {
					requester = "another user"
				}
				g.creates.note(ts.key(), c.createdBy, requester, created, time.Time{}, !c.createdFromStore)
				g.creates.now = func() time.Time { return now }
			}
			d := g.decide(t.Context(), f)
			spec := f.object.spec()
			if seen[spec.kind] == nil {
				seen[spec.kind] = map[contract.Reason]bool{}
			}
			seen[spec.kind][d.reason] = true
			declared := spec.admissions
			if d.deny {
				declared = spec.refusals
			}
			if !slices.Contains(declared, d.reason) {
				t.Errorf("a %s decided deny %v for %s, which its kindSpec does not declare: no metric series starts at 0 for it", spec.kind, d.deny, d.reason)
			}
			wantRow := c.wantRow
			if wantRow == "" {
				wantRow = c.row
			}
			if d.deny != c.deny || d.reason != c.reason || d.source != c.source || d.row != wantRow {
				t.Errorf("decision = deny %v reason %s source %q row %s, want deny %v reason %s source %q row %s (live error: %v)",
					d.deny, d.reason, d.source, d.row, c.deny, c.reason, c.source, wantRow, d.liveErr)
			}
			if made := calls > 0; made != (c.live != liveNone) {
				t.Errorf("live read made %d times; the case wants it made: %v", calls, c.live != liveNone)
			}
			if made := nodeCalls > 0; made != (c.nodes != nodesNone) {
				t.Errorf("whole read of the name's holder made %d times; the case wants it made: %v", nodeCalls, c.nodes != nodesNone)
			}
		})
	}
	if ran < len(cases) {
		t.Logf("%d of %d rows ran (-run): the declared reasons are checked against the whole table only", ran, len(cases))
		return
	}
	for _, k := range kinds {
		for _, r := range slices.Concat(k.refusals, k.admissions) {
			if !seen[k.kind][r] {
				t.Errorf("%s declares %s, which no row of the table gives it: a metric series that can never move", k.kind, r)
			}
		}
	}
}

// TestDecisionTableWalksTheDocInOrder: every row of docs/decisions.md's tables has a case in
// TestDecisionTable, the cases come in the rows' order, and every row a decision names is in
// the doc.
func TestDecisionTableWalksTheDocInOrder(t *testing.T) {
	raw, err := os.ReadFile("../docs/decisions.md")
	if err != nil {
		t.Fatal(err)
	}
	var docRows []string
	for _, m := range regexp.MustCompile(`(?m)^\| ([TE]?[0-9]+) \|`).FindAllStringSubmatch(string(raw), -1) {
		docRows = append(docRows, m[1])
	}
	var caseRows []string
	for _, c := range decisionCases() {
		if len(caseRows) == 0 || caseRows[len(caseRows)-1] != c.row {
			caseRows = append(caseRows, c.row)
		}
		if c.wantRow != "" && !slices.Contains(docRows, c.wantRow) {
			t.Errorf("case %q answers by row %s, which docs/decisions.md does not have", c.name, c.wantRow)
		}
	}
	if strings.Join(caseRows, " ") != strings.Join(docRows, " ") {
		t.Errorf("the cases walk rows\n  %s\nand docs/decisions.md has\n  %s", strings.Join(caseRows, " "), strings.Join(docRows, " "))
	}
}

// TestEachRoleReadsWithinItsBudget: the pods a workflow sends many of, one after another in one
// pass of Argo's controller (hooks at every level, and steps once the guard's watch is stale),
// read their workflow within --hook-step-read-budget; exit-handler and agent pods (one or two a
// workflow) and TaskSet writes within --live-read-budget. A pod a node name alone cannot tell
// from a hook (under a DAG task named "hooks") gets the short budget either way.
func TestEachRoleReadsWithinItsBudget(t *testing.T) {
	wf := tableWorkflow
	dagTaskNamedHooks := fixture.Pod(wf, wf.GetName()+"-build", wf.GetName()+".hooks.build")
	stepHook := fixture.Pod(wf, wf.GetName()+"-step-hook", wf.GetName()+"[0].work.hooks.failed")
	underHook := fixture.Pod(wf, wf.GetName()+"-under-hook", wf.GetName()+".hooks.failed[0].notify")
	def := DefaultOptions()
	for _, c := range []struct {
		name       string
		facts      func(t *testing.T) facts
		staleWatch bool
		want       time.Duration
	}{
		{"an exit-handler pod", func(t *testing.T) facts { return podFacts(t, fixture.ExitPod(wf)) }, false, def.LiveReadBudget},
		{"an agent pod", func(t *testing.T) facts { return podFacts(t, fixture.AgentPod(wf)) }, false, def.LiveReadBudget},
		{"a workflow-level hook pod", func(t *testing.T) facts { return podFacts(t, fixture.HookPod(wf)) }, false, def.HookStepReadBudget},
		{"a step-level hook pod", func(t *testing.T) facts { return podFacts(t, stepHook) }, false, def.HookStepReadBudget},
		{"a pod of a step under a hook", func(t *testing.T) facts { return podFacts(t, underHook) }, false, def.HookStepReadBudget},
		{"a pod under a DAG task named hooks", func(t *testing.T) facts { return podFacts(t, dagTaskNamedHooks) }, false, def.HookStepReadBudget},
		{"a step pod, the watch stale", func(t *testing.T) facts { return podFacts(t, fixture.StepPod(wf)) }, true, def.HookStepReadBudget},
		{"a TaskSet write", func(t *testing.T) facts {
			return taskSetFacts(t, wf, []string{}, "true", []string{argo.NodeID(wf.GetName(), argo.OnExitNodeName(wf.GetName()))}, "false")
		}, false, def.LiveReadBudget},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := newGuard(nil, storeFor(t, wf, storeRunning, c.staleWatch), Options{})
			if err != nil {
				t.Fatal(err)
			}
			var budgets []time.Duration
			g.readLive = func(_ context.Context, _, _ string, p readPolicy) (*argo.Workflow, error) {
				budgets = append(budgets, p.budget)
				if p.attempt > p.budget {
					t.Errorf("an attempt of %s in a budget of %s", p.attempt, p.budget)
				}
				return nil, errors.Join(errLiveReadTimeout, context.DeadlineExceeded)
			}
			g.decide(t.Context(), c.facts(t))
			if len(budgets) != 1 || budgets[0] != c.want {
				t.Errorf("live reads within %v, want one within %v", budgets, c.want)
			}
		})
	}
}

// TestStoreFirstTrustsOnlyTheWatchOfTheStepsNamespace: with a watch per namespace
// (--namespaces), a step pod is decided from the store only while its own namespace's watch is
// fresh: another namespace's events say nothing of it (row 19 otherwise).
func TestStoreFirstTrustsOnlyTheWatchOfTheStepsNamespace(t *testing.T) {
	wf := tableWorkflow
	for _, c := range []struct {
		name     string
		advanced string // the namespace whose watch just advanced
		wantRead bool
	}{
		{"the step's namespace advanced", wf.GetNamespace(), false},
		{"only another namespace advanced", "another", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			store, clk := fakeClockStore(t)
			store.SetWatchPerNamespace(true)
			store.ProgressIn(wf.GetNamespace(), "1")
			clk.Step(time.Hour)
			store.ProgressIn(c.advanced, "2")
			store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: wf.GetNamespace(), Name: wf.GetName(), ResourceVersion: "1", Phase: argo.PhaseRunning})
			g, err := newGuard(nil, store, Options{Namespaces: []string{wf.GetNamespace(), "another"}})
			if err != nil {
				t.Fatal(err)
			}
			calls := 0
			g.readLive = cannedRead(liveRunning, &calls)
			d := g.decide(t.Context(), podFacts(t, fixture.StepPod(wf)))
			if read := calls > 0; read != c.wantRead || d.deny {
				t.Errorf("live read made: %v (want %v), decision deny %v row %s", read, c.wantRead, d.deny, d.row)
			}
		})
	}
}
