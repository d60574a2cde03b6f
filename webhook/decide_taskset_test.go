package webhook

import (
	"strings"
	"testing"
	"time"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// TestRepeatedCreatesAreReadAgainEachRepeatMemory: a create row T7 admits does not renew what
// the guard remembers, so a TaskSet pending for long is read again once per repeatMemory, and
// the create that read admits starts the next stretch.
func TestRepeatedCreatesAreReadAgainEachRepeatMemory(t *testing.T) {
	for _, tc := range []struct {
		repeatsFor time.Duration
		want       string
		reads      int
	}{
		// Passes at 0, 1/3, 2/3, 1, 4/3, ... of the window: read at 0, then again at 4/3.
		{0, "5 T7 T7 T7 5 T7 T7 T7", 2},
		{-1, "5 5 5 5 5 5 5 5", 8},
	} {
		g, err := newGuard(nil, storeFor(t, tableWorkflow, storeRunning, false), Options{TaskSetRepeatsFor: tc.repeatsFor})
		if err != nil {
			t.Fatal(err)
		}
		calls := 0
		g.readLive = cannedRead(liveRunning, &calls)
		now := time.Now()
		g.taskSets().creates.now = func() time.Time { return now }
		key, _ := fixture.OnExitTask(tableWorkflow)
		f := taskSetFacts(t, tableWorkflow, nil, "", []string{key}, "false")
		var rows []string
		for range 8 {
			f.received = now
			rows = append(rows, g.decide(t.Context(), f).row)
			now = now.Add(DefaultOptions().TaskSetRepeatsFor / 3)
		}
		if got := strings.Join(rows, " "); got != tc.want || calls != tc.reads {
			t.Errorf("--taskset-repeats-for %s: rows %s (%d reads), want %s (%d reads)", tc.repeatsFor, got, calls, tc.want, tc.reads)
		}
	}
}

// TestARefusalForgetsTheAdmittedCreate: once a TaskSet write of the workflow is refused (here
// a create with one more task finds its name held by another workflow: row 9, a deletion the
// store has not seen), the
// create admitted before no longer lets the same create in without a read.
func TestARefusalForgetsTheAdmittedCreate(t *testing.T) {
	g, err := newGuard(nil, storeFor(t, tableWorkflow, storeRunning, false), Options{})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	g.readLive = cannedRead(liveRunning, &calls)
	key, _ := fixture.OnExitTask(tableWorkflow)
	create := taskSetFacts(t, tableWorkflow, nil, "", []string{key}, "false")
	if d := g.decide(t.Context(), create); d.row != "5" {
		t.Fatalf("the first create: row %s, want 5", d.row)
	}
	if d := g.decide(t.Context(), create); d.row != "T7" {
		t.Fatalf("the same create again: row %s, want T7", d.row)
	}
	g.readLive = cannedRead(liveOtherUID, &calls)
	another := taskSetFacts(t, tableWorkflow, nil, "", []string{key, argo.NodeID(tableWorkflow.GetName(), tableWorkflow.GetName()+"[0].call")}, "false")
	if d := g.decide(t.Context(), another); d.row != "9" || !d.deny {
		t.Fatalf("a create with another task, the name held by another workflow: %s (row %s), want refused by row 9", d.reason, d.row)
	}
	if d := g.decide(t.Context(), create); d.row != "9" || !d.deny {
		t.Errorf("the same create after the refusal: row %s deny %v, want read and refused by row 9", d.row, d.deny)
	}
}

// TestTaskSetCreateThenPatchOfAReusedName: a workflow that reused the name of a deleted one
// creates its TaskSet (admitted: it runs), the create fails with AlreadyExists, and Argo
// patches the old object, which still names the deleted workflow: the guard admits the patch
// from the create it remembers (row T6), without reading the node tree, and refuses it (row T5)
// when it judged no such create, or only a dry run of it.
func TestTaskSetCreateThenPatchOfAReusedName(t *testing.T) {
	onExit := argo.NodeID(tableWorkflow.GetName(), argo.OnExitNodeName(tableWorkflow.GetName()))
	for _, how := range []string{"create", "dry-run create", "none"} {
		created := how == "create"
		g, err := newGuard(nil, storeFor(t, tableWorkflow, storeEmpty, false), Options{})
		if err != nil {
			t.Fatal(err)
		}
		calls, nodeCalls := 0, 0
		g.readLive = cannedRead(liveRunning, &calls)
		g.readNodes = cannedNodes(nodesNotWritten, nil, &nodeCalls)
		if how != "none" {
			create := taskSetFacts(t, tableWorkflow, nil, "", []string{onExit}, "false")
			create.dryRun = how == "dry-run create"
			if d := g.decide(t.Context(), create); d.deny || d.row != "5" {
				t.Fatalf("the %s: deny %v row %s, want admitted by row 5", how, d.deny, d.row)
			}
		}
		patch := taskSetFacts(t, tableWorkflow, []string{}, "true", []string{onExit}, "false")
		patch.owner.UID = "uid-of-the-deleted-workflow"
		d := g.decide(t.Context(), patch)
		want, wantNodeReads := "T6", 0
		if !created {
			want, wantNodeReads = "T5", 1
		}
		if d.row != want || d.deny != !created || nodeCalls != wantNodeReads {
			t.Errorf("judged first: %s; the patch: deny %v row %s, %d reads of the node tree; want row %s, %d reads", how, d.deny, d.row, nodeCalls, want, wantNodeReads)
		}
	}
}
