package webhook

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// The WorkflowTaskSet's own rows of docs/decisions.md: T7 before the shared decision, T5 and T6
// after it (taskSetSpec's hooks).

// taskSetBeforeRead is row T7: a create that repeats one admitted seconds before is admitted
// with no read (checked before row 4, which every TaskSet write passes, and before T4). Not
// remembered again, so that a TaskSet pending longer than --taskset-repeats-for is read again;
// told apart afterwards if it came after the name's reuse (repeats).
func (g *guard) taskSetBeforeRead(_ context.Context, f facts, d decision) (decision, bool) {
	if !g.repeatsAdmittedCreate(f, d) {
		return d, false
	}
	d.reason, d.row = contract.ReasonRepeatsAdmittedCreate, "T7"
	if !f.dryRun {
		g.taskSets().repeats.note(types.NamespacedName{Namespace: d.wfNamespace, Name: d.wfName}, d.wfUID, f.object.(*taskSetObject).name, f.received)
	}
	return d, true
}

// taskSetAfterRead remembers a create the shared decision admitted (noteCreate), and decides
// rows T5 and T6: an update of a TaskSet whose owner is gone, refused by the shared rows, is
// refused as the owner's being gone, perhaps by the workflow that reused its name (a live 404
// stays row 8: no workflow holds the name to write), unless that workflow sent it.
func (g *guard) taskSetAfterRead(ctx context.Context, f facts, d decision) decision {
	g.noteCreate(f, d)
	if f.update && d.deny &&
		(d.reason == contract.ReasonWorkflowReplaced || d.reason == contract.ReasonWorkflowDeleted && d.source == sourceStore) {
		d.reason, d.row = contract.ReasonTaskSetOwnerGone, "T5"
		if d.nameHolder != "" && g.nameHolderWrote(ctx, f, d) {
			// Row T6: the workflow that holds the name sent it.
			d.deny, d.reason, d.row = false, contract.ReasonTasksOfNameHolder, "T6"
		}
	}
	return d
}

// noteCreate remembers the TaskSet create of a running workflow that d admits, with the user
// that sent it: should it fail with AlreadyExists, Argo's patch of the existing object follows
// at once (row T6), and the same create on its next passes (row T7, when a live read found the
// workflow running), both sent by the same user. Not a dry run's, nor an unexpected
// requester's. A refusal of a TaskSet write for the workflow forgets what was remembered of it.
func (g *guard) noteCreate(f facts, d decision) {
	ts := f.object.(*taskSetObject)
	key := ts.key()
	switch {
	case d.deny:
		g.taskSets().creates.forget(key, d.wfUID)
	case !f.update && !f.dryRun && !f.unexpected && d.reason == contract.ReasonWorkflowNotTerminal:
		g.taskSets().creates.note(key, d.wfUID, f.requester, ts.templates, f.received, d.source == sourceLive)
	}
}

// repeatsAdmittedCreate says whether f is a TaskSet create whose every task, with the same
// template, this replica admitted in a create of the same TaskSet by the same workflow (by
// UID), sent by the same user, after a live read found it running (row 5), received less than
// --taskset-repeats-for ago, and whether the store still holds that workflow, not deleted, not
// complete (row T7). Such a create fails with AlreadyExists unless the first one did not land (another webhook refused
// it, the API server failed) or the TaskSet was deleted since (with its workflow); even then
// it hands the agent only what was found admissible seconds before. A stale copy's create of a
// TaskSet that does not exist yet (its exit handler the first HTTP node) adds a task no
// admitted create had. docs/decisions.md says what is left: a name reused within seconds while
// the guard's watch has not seen the deletion.
func (g *guard) repeatsAdmittedCreate(f facts, d decision) bool {
	ts := f.object.(*taskSetObject)
	if f.update || !g.taskSets().creates.repeats(ts.key(), d.wfUID, f.requester, ts.templates) {
		return false
	}
	rec, ok := g.store.Get(d.wfUID)
	return ok && !rec.Deleted && rec.Phase != argo.PhaseUnsettled && !rec.Phase.Terminal()
}

// nameHolderWrote says whether the workflow that now holds the name (d.nameHolder) sent a
// TaskSet update: it created that TaskSet with every task the update hands the agent
// (taskSetObject.handed: the tasks it adds, or every task of a TaskSet it only reopens)
// moments before (taskSetCreates: Argo's create, then the patch on AlreadyExists, in one
// pass), or each of them is a pending node of its (nameHolderRunsTasks).
func (g *guard) nameHolderWrote(ctx context.Context, f facts, d decision) bool {
	ts := f.object.(*taskSetObject)
	if d.nameHolderDone {
		return false
	}
	if _, templates := ts.handed(); g.taskSets().creates.covers(ts.key(), d.nameHolder, f.requester, templates) {
		return true
	}
	return g.nameHolderRunsTasks(ctx, f, d)
}

// nameHolderRunsTasks says whether every task a TaskSet update hands the agent is a pending
// HTTP or plugin node of the workflow that now holds the name (d.nameHolder), which is not complete:
// read whole, live, within one attempt's time. Argo adds a node's task in the pass that
// creates the node and writes the node to the status after, so this admits a later pass's
// write (the first pass's is known by its create, when this replica judged it). A stale copy of the deleted
// workflow is admitted only for tasks the new workflow has pending under the same node IDs
// (the same name), which the new workflow's agent runs in any case.
func (g *guard) nameHolderRunsTasks(ctx context.Context, f facts, d decision) bool {
	tasks, _ := f.object.(*taskSetObject).handed()
	if len(tasks) == 0 {
		return false
	}
	// Within what is left of the live-read budget, and one attempt's time at most.
	left := g.podRead.attempt
	if !f.received.IsZero() {
		left = min(left, g.podRead.budget-time.Since(f.received))
	}
	if left <= 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), left)
	defer cancel()
	if shed(ctx) {
		return false
	}
	uid, phase, nodes, err := g.readNodes(ctx, d.wfNamespace, d.wfName)
	if err != nil || uid != d.nameHolder || phase.Terminal() {
		return false
	}
	for _, id := range tasks {
		n, ok := nodes[id]
		if !ok || n.Type != argo.NodeTypeHTTP && n.Type != argo.NodeTypePlugin || !n.Pending() || n.InExitHandlerOrHook(d.wfName) {
			return false
		}
	}
	return true
}

// errNodesShed: the whole read of row T6 was not made, the process having as many further
// reads in flight as it allows.
var errNodesShed = errors.New("the read of the name's holder was not made: too many further live reads in flight")

// liveNodes reads a workflow whole, with the name, type and phase of each node: one attempt. It
// is a further read beyond the decision's first (maxExtraLiveReads bounds it; none free, it is
// shed), timed in the live-read histogram, and its failures are counted as live reads'.
func (g *guard) liveNodes(ctx context.Context, namespace, name string) (types.UID, argo.Phase, map[string]argo.Node, error) {
	select {
	case g.extraReads <- struct{}{}:
	default:
		g.metrics.liveReadAttempts.WithLabelValues("shed").Inc()
		return "", "", nil, errNodesShed
	}
	defer func() { <-g.extraReads }()
	start := time.Now()
	wf := &argo.WorkflowNodes{}
	err := g.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, wf)
	result := "found"
	switch {
	case err == nil:
	case apierrors.IsNotFound(err):
		result = "not-found"
	case errors.Is(err, context.DeadlineExceeded):
		result = "timeout"
	default:
		result = "error"
	}
	g.metrics.liveRead.WithLabelValues(result).Observe(time.Since(start).Seconds())
	if result == "timeout" || result == "error" {
		g.metrics.liveReadFailures.WithLabelValues(result).Inc()
	}
	if err != nil {
		return "", "", nil, err
	}
	return wf.UID, wf.Status.Phase, wf.Status.Nodes, nil
}

// taskSetOwn is what the TaskSet's rows keep beside the guard.
type taskSetOwn struct {
	// creates remembers the TaskSet creates admitted for running workflows (rows T6 and T7).
	creates *taskSetCreates
	// repeats remembers the row T7 admissions, to tell when one came after the name's reuse.
	repeats *repeats
}

func newTaskSetOwn(o Options) any {
	return &taskSetOwn{creates: newTaskSetCreates(time.Now, o.TaskSetRepeatsFor), repeats: newRepeats(time.Now)}
}

// taskSets is what the TaskSet's rows keep beside g.
func (g *guard) taskSets() *taskSetOwn { return g.own[kindTaskSet].(*taskSetOwn) }

// startTaskSetRows registers what row T7 keeps: the count of its admissions that came after the
// name's reuse, and the store's listener that tells them.
func startTaskSetRows(g *guard, reg prometheus.Registerer, store *completionstore.Store) error {
	if err := reg.Register(g.taskSets().repeats.counter); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	store.OnObserve(g.recovered("repeats", g.observedRepeats))
	return nil
}
