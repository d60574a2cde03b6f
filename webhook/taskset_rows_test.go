package webhook

import (
	"crypto/sha256"
	"encoding/json"
	"maps"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// The WorkflowTaskSet's part of the shared checks (kinds_test.go): rows T1 to T7.
var _ = addKindTest(kindTaskSet, kindTest{
	cases: taskSetDecisionCases,
	refusable: func(t *testing.T) facts {
		key, _ := fixture.OnExitTask(tableWorkflow)
		return taskSetFacts(t, tableWorkflow, nil, "", []string{key}, "false")
	},
	review: func(op admissionv1.Operation, object []byte) []byte { return taskSetReviewOf(op, object, nil) },
	seeds:  taskSetSeeds,
})

// taskSetPrep readies the guard for a case of the TaskSet's rows: the create it remembers
// admitting (rows T6, T7) and how the whole read of the workflow that holds the owner's name
// answers (T5, T6).
type taskSetPrep struct {
	nodes nodesAnswer
	// by: the guard admitted a create of the TaskSet by that workflow, ago before the case,
	// with the tasks the case's write adds (another task with otherTask, another template with
	// otherTemplate, without those tasks); fromStore: admitted from the store (rows 13, 17), not
	// after a live read; byOtherUser: sent by another user than the case's write (another
	// tenant of the namespace; Argo's controller sends both).
	by                                  types.UID
	ago                                 time.Duration
	otherTask, otherTemplate, fromStore bool
	byOtherUser                         bool
	without                             []string
}

func (p taskSetPrep) prepare(_ *testing.T, g *guard, f facts) func(*testing.T) {
	ts := f.object.(*taskSetObject)
	tasks, handed := ts.handed()
	nodeCalls := 0
	g.readNodes = cannedNodes(p.nodes, tasks, &nodeCalls)
	if p.by != "" {
		now := time.Now()
		g.taskSets().creates.now = func() time.Time { return now.Add(-p.ago) }
		created := maps.Clone(handed)
		switch {
		case p.otherTask:
			created = map[string][sha256.Size]byte{"another-task": {}}
		case p.without != nil:
			for _, k := range p.without {
				delete(created, k)
			}
		case p.otherTemplate:
			for k := range created {
				created[k] = sha256.Sum256([]byte("another template"))
			}
		}
		requester := f.requester
		if p.byOtherUser {
			requester = "another user"
		}
		g.taskSets().creates.note(ts.key(), p.by, requester, created, time.Time{}, !p.fromStore)
		g.taskSets().creates.now = func() time.Time { return now }
	}
	return func(t *testing.T) {
		if made := nodeCalls > 0; made != (p.nodes != nodesNone) {
			t.Errorf("whole read of the name's holder made %d times; the case wants it made: %v", nodeCalls, p.nodes != nodesNone)
		}
	}
}

// taskSetDecisionCases walks rows T1 to T7 of docs/decisions.md.
func taskSetDecisionCases() []decisionCase {
	wf := tableWorkflow
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
	watchOnly := Options{Namespaces: []string{"argo"}}
	storeFirst := Options{StoreFirst: true}
	completion := Options{StoreFallback: FallbackCompletion}
	tombstone := Options{StoreFallback: FallbackTombstone}

	return []decisionCase{
		{row: "T1", name: "TaskSet without a Workflow owner reference", facts: notOwnedWrite, reason: contract.ReasonNotOwnedByWorkflow},
		{row: "T2", name: "TaskSet, namespace not guarded", facts: elsewhereWrite, opts: watchOnly, reason: contract.ReasonNamespaceNotWatched},
		{row: "T3", name: "TaskSet cleanup of a succeeded workflow (tasks removed, completed set)", facts: cleanup, reason: contract.ReasonNoNewTask},
		{row: "T7", name: "TaskSet created again with the tasks and templates this replica admitted for the workflow after a live read 1 s before, the store holding it running (Argo's next pass: AlreadyExists)", facts: created, prepare: taskSetPrep{by: wf.GetUID(), ago: time.Second}.prepare, store: storeRunning, reason: contract.ReasonRepeatsAdmittedCreate},
		{row: "T7", name: "TaskSet created again, dry run", facts: dryRun(created), prepare: taskSetPrep{by: wf.GetUID(), ago: time.Second}.prepare, store: storeRunning, reason: contract.ReasonRepeatsAdmittedCreate},
		{row: "T4", name: "as 5: task added, live Running", facts: stale, live: liveRunning, store: storeSucceeded, reason: contract.ReasonWorkflowNotTerminal, source: sourceLive, wantRow: "5"},
		{row: "T4", name: "as 6: task added, live Succeeded", facts: stale, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: completed set back alone, live Succeeded", facts: reopenOnly, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created, live Succeeded", facts: created, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created with a task the create admitted for the workflow lacked (a stale copy's exit handler), live Succeeded", facts: created, prepare: taskSetPrep{by: wf.GetUID(), ago: time.Second, otherTask: true}.prepare, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created with the task admitted for the workflow, another template, live Succeeded", facts: created, prepare: taskSetPrep{by: wf.GetUID(), ago: time.Second, otherTemplate: true}.prepare, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created as admitted for the workflow, older than the repeat memory, live Succeeded", facts: created, prepare: taskSetPrep{by: wf.GetUID(), ago: DefaultOptions().TaskSetRepeatsFor + time.Second}.prepare, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created as admitted for the workflow from the store (no live read), live Succeeded", facts: created, prepare: taskSetPrep{by: wf.GetUID(), ago: time.Second, fromStore: true}.prepare, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created as admitted for the workflow 1 s before, the store since saw it succeed, live Succeeded", facts: created, prepare: taskSetPrep{by: wf.GetUID(), ago: time.Second}.prepare, store: storeSucceeded, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 9: TaskSet created as admitted for the workflow 1 s before, the store since saw it deleted (its name reused), live other UID", facts: created, prepare: taskSetPrep{by: wf.GetUID(), ago: time.Second}.prepare, store: storeTombstone, live: liveOtherUID, deny: true, reason: contract.ReasonWorkflowReplaced, source: sourceLive, wantRow: "9"},
		{row: "T4", name: "as 15: TaskSet created as admitted for the workflow 1 s before, the store holding nothing of it, read fails", facts: created, prepare: taskSetPrep{by: wf.GetUID(), ago: time.Second}.prepare, live: liveFails, reason: contract.ReasonUnverifiedFailOpen, wantRow: "15"},
		{row: "T4", name: "as 6: TaskSet created again with the tasks and templates admitted for the workflow after a live read 1 s before, in a create another user sent, live Succeeded", facts: created, prepare: taskSetPrep{by: wf.GetUID(), ago: time.Second, byOtherUser: true}.prepare, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: TaskSet created as admitted for another workflow of the name, live Succeeded", facts: created, prepare: taskSetPrep{by: "uid-of-another", ago: time.Second}.prepare, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		{row: "T4", name: "as 6: task added by an update, a create of it admitted for the workflow 1 s before (the patch after AlreadyExists is judged), live Succeeded", facts: stale, prepare: taskSetPrep{by: wf.GetUID(), ago: time.Second}.prepare, store: storeRunning, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
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
		{row: "T5", name: "owner's name held by another, its status lacks the task's node (its first pass, or a stale copy's task)", facts: stale, prepare: taskSetPrep{nodes: nodesNotWritten}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, whose node of the task has finished", facts: stale, prepare: taskSetPrep{nodes: nodesDone}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, whose node of that ID is a pod", facts: stepWrite, prepare: taskSetPrep{nodes: nodesOfPods}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, which has completed", facts: stale, prepare: taskSetPrep{nodes: nodesHolderDone}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, and by a third at the whole read", facts: stale, prepare: taskSetPrep{nodes: nodesAnotherHolder}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, whole read fails", facts: stale, prepare: taskSetPrep{nodes: nodesFail}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "update that only sets completed back, owner's name held by another", facts: reopenOnly, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "update that only sets completed back on tasks the object holds, owner's name held by another, its status lacks their nodes", facts: reopenHeld, prepare: taskSetPrep{nodes: nodesNotWritten}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "update that only sets completed back on tasks the object holds, one a leftover the name's holder did not create (the deleted workflow's exit handler)", facts: reopenHeldExit, prepare: taskSetPrep{nodes: nodesNotWritten, by: "uid-of-another", ago: time.Second, without: []string{onExit}}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "update of a TaskSet whose owner the store saw deleted, read fails", facts: stale, live: liveFails, store: storeTombstone, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceStore},
		{row: "T5", name: "owner's name held by another; a create with these tasks remembered, by a third", facts: stale, prepare: taskSetPrep{nodes: nodesNotWritten, by: "uid-of-a-third"}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another; a create with these tasks remembered for it, sent by another user (another tenant of the namespace)", facts: stale, prepare: taskSetPrep{nodes: nodesNotWritten, by: "uid-of-another", ago: time.Second, byOtherUser: true}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another; its create remembered, older than the memory", facts: stale, prepare: taskSetPrep{nodes: nodesNotWritten, by: "uid-of-another", ago: createMemory + time.Second}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another; its create remembered, with other tasks", facts: stale, prepare: taskSetPrep{nodes: nodesNotWritten, by: "uid-of-another", otherTask: true}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another; its create remembered, the same task with another template (a stale copy's own)", facts: stale, prepare: taskSetPrep{nodes: nodesNotWritten, by: "uid-of-another", otherTemplate: true}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another that has completed; its create remembered", facts: stale, prepare: taskSetPrep{by: "uid-of-another", ago: time.Second}.prepare, live: liveOtherUIDDone, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T5", name: "owner's name held by another, whose pending node of the task is in its exit handler (known only from a create)", facts: stale, prepare: taskSetPrep{nodes: nodesPendingExitHandler}.prepare, live: liveOtherUID, deny: true, reason: contract.ReasonTaskSetOwnerGone, source: sourceLive},
		{row: "T6", name: "owner's name held by another, which created the TaskSet with these tasks just before (AlreadyExists, then this patch)", facts: stale, prepare: taskSetPrep{by: "uid-of-another", ago: time.Second}.prepare, live: liveOtherUID, reason: contract.ReasonTasksOfNameHolder, source: sourceLive},
		{row: "T6", name: "owner's name held by another that runs, each task its pending HTTP node", facts: stepWrite, prepare: taskSetPrep{nodes: nodesPending}.prepare, live: liveOtherUID, reason: contract.ReasonTasksOfNameHolder, source: sourceLive},
		{row: "T6", name: "update that only sets completed back on tasks the object holds, owner's name held by another, which created the TaskSet with them just before", facts: reopenHeld, prepare: taskSetPrep{by: "uid-of-another", ago: time.Second}.prepare, live: liveOtherUID, reason: contract.ReasonTasksOfNameHolder, source: sourceLive},
		{row: "T6", name: "update that only sets completed back on tasks the object holds, owner's name held by another that runs, each its pending HTTP node", facts: reopenHeld, prepare: taskSetPrep{nodes: nodesPending}.prepare, live: liveOtherUID, reason: contract.ReasonTasksOfNameHolder, source: sourceLive},
	}
}

// taskSetSeeds are reviews of TaskSet writes for FuzzAdmissionReview: of a completed workflow,
// a running one, a deleted one; cleanup; malformed tasks.
func taskSetSeeds(*testing.F) [][]byte {
	var seeds [][]byte
	owned := func(wf, uid string) string {
		return `"ownerReferences":[{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"` + wf + `","uid":"` + uid + `"}]`
	}
	for _, wf := range [][2]string{{"done", "uid-done"}, {"running", "uid-running"}, {"gone", "uid-gone"}} {
		before := `{"metadata":{"name":"` + wf[0] + `",` + owned(wf[0], wf[1]) + `,"labels":{"workflows.argoproj.io/completed":"true"}},"spec":{}}`
		after := `{"metadata":{"name":"` + wf[0] + `",` + owned(wf[0], wf[1]) + `,"labels":{"workflows.argoproj.io/completed":"false"}},"spec":{"tasks":{"` + wf[0] + `-1":{"name":"n","http":{"url":"http://x"}}}}}`
		seeds = append(seeds, taskSetReviewOf(admissionv1.Update, []byte(after), []byte(before)),
			taskSetReviewOf(admissionv1.Update, []byte(before), []byte(after)),
			taskSetReviewOf(admissionv1.Create, []byte(after), nil))
	}
	return append(seeds, taskSetReviewOf(admissionv1.Update, []byte(`{"spec":{"tasks":[]}}`), []byte(`{}`)),
		taskSetReviewOf(admissionv1.Update, []byte(`{"metadata":{`+owned("done", "uid-done")+`},"spec":{"tasks":{"a":1}}}`), nil))
}

// FuzzReadTaskSet feeds arbitrary WorkflowTaskSet objects, new and old, to the TaskSet path's
// decoder (its metadata, its tasks each kept raw for its digest): it must never panic, and must
// either go on with facts or answer.
func FuzzReadTaskSet(f *testing.F) {
	owned := `"ownerReferences":[{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"w","uid":"u"}]`
	f.Add([]byte(`{"metadata":{"name":"w",`+owned+`,"labels":{"workflows.argoproj.io/completed":"false"}},"spec":{"tasks":{"w-1":{"name":"n","http":{"url":"http://x"}}}}}`),
		[]byte(`{"metadata":{"name":"w",`+owned+`,"labels":{"workflows.argoproj.io/completed":"true"}},"spec":{}}`), true)
	f.Add([]byte(`{"spec":{"tasks":{"a":null,"b":[],"c":"x"}}}`), []byte(`null`), false)
	f.Add([]byte(`{"spec":{"tasks":[]}}`), []byte(`{"spec":{"tasks":{"a":{}}}}`), true)
	f.Add([]byte(`{"metadata":{"labels":null,"ownerReferences":{}}}`), []byte(``), false)
	f.Fuzz(func(t *testing.T, raw, old []byte, update bool) {
		op := admissionv1.Create
		if update {
			op = admissionv1.Update
		}
		body := taskSetReviewOf(op, raw, old)
		if !json.Valid(raw) || len(old) > 0 && !json.Valid(old) {
			// Not JSON values: the review as the API server could never send it, raw.
			body = []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"f","operation":"` + string(op) + `","object":` + string(raw) + `,"oldObject":` + string(old) + `}}`)
		}
		_, fa, resp := readTaskSetReview(body)
		if err := checkRead(fa, resp); err != nil {
			t.Fatal(err)
		}
	})
}
