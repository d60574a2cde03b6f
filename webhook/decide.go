package webhook

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// Reason is the stable code of a decision: in metrics, logs and audit annotations, and, for a
// refusal, in the Status.details.causes of the answer (RefusalReason reads it back). Each
// names one or more rows of docs/decisions.md.
type Reason string

// Reasons to admit.
const (
	ReasonNotOwnedByWorkflow         Reason = "not-owned-by-workflow"
	ReasonArtifactGCOrOtherComponent Reason = "artifact-gc-or-other-component"
	ReasonNamespaceNotWatched        Reason = "namespace-not-watched"
	ReasonNotCoveredByPolicy         Reason = "not-covered-by-policy"
	ReasonNoNewTask                  Reason = "no-new-task"
	// ReasonNotAFailureClaim: an Event about a workflow that does not say it failed.
	ReasonNotAFailureClaim Reason = "not-a-failure-claim"
	// ReasonClaimMatchesPhase: an Event that says the workflow failed, which it did (Failed or
	// Error). A stale duplicate of a real failure's Event cannot be told from the real one.
	ReasonClaimMatchesPhase Reason = "claim-matches-phase"
	// ReasonWorkflowGone: an Event that says the workflow failed, whose workflow no longer
	// exists and was not seen succeeding: a real failure's Event may land after its workflow
	// was deleted (a TTL), so only a tombstone whose last phase was Succeeded refuses.
	ReasonWorkflowGone        Reason = "workflow-gone"
	ReasonWorkflowNotTerminal Reason = "workflow-not-terminal"
	ReasonPhaseNotDenied      Reason = "phase-not-denied"
	ReasonNotSeenCompleted    Reason = "not-seen-completed"
	// ReasonUnverifiedFailOpen: no live read answered, and the store knows nothing of the
	// workflow, or not its phase.
	ReasonUnverifiedFailOpen Reason = "unverified-fail-open"
	// ReasonUnconfirmedCompletion: the store says completed, no live read answered, and the
	// store fallback lets only tombstones refuse.
	ReasonUnconfirmedCompletion Reason = "unconfirmed-completion"
	// ReasonTasksOfNameHolder: an update of a WorkflowTaskSet whose owner was deleted, every
	// task it adds a pending HTTP or plugin node of the running workflow that now holds the
	// name (read live): that workflow's own write after AlreadyExists (row T6).
	ReasonTasksOfNameHolder Reason = "tasks-of-name-holder"
	// ReasonRepeatsAdmittedCreate: a WorkflowTaskSet create that repeats, task for task and
	// template for template, one this replica admitted for the same workflow (by UID) after a
	// live read found it running, seconds before, the store still holding it running (row
	// T7): Argo sends it on every pass while an HTTP or plugin node is pending, and it fails
	// with AlreadyExists; the patch after it is judged.
	ReasonRepeatsAdmittedCreate Reason = "repeats-admitted-create"
)

// Reasons to refuse.
const (
	ReasonWorkflowCompleted Reason = "workflow-completed"
	ReasonWorkflowDeleted   Reason = "workflow-deleted"
	ReasonWorkflowReplaced  Reason = "workflow-replaced"
	// ReasonWorkflowSucceeded refuses an Event that says the workflow failed, when the
	// workflow, by UID, Succeeded.
	ReasonWorkflowSucceeded Reason = "workflow-succeeded"
	// ReasonTaskSetOwnerGone refuses an update of a WorkflowTaskSet whose owner was deleted
	// (another workflow now holds its name, or the store keeps a tombstone and no live read
	// answered), unless row T6 admits it. The agent of the workflow that holds the name runs
	// every task of the TaskSet named like it, so a stale copy's write must not land; a new
	// workflow's own write (Argo patches on AlreadyExists, and the patched object keeps the
	// old owner) is refused only while its nodes are not yet written to its status, and comes
	// again on its next pass. Not a stale exit handler: counted apart, never alerted as one.
	ReasonTaskSetOwnerGone Reason = "taskset-owner-gone"
)

// refusalReasons are the reasons a refusal carries (kindSpec.refusals, those of each kind).
var refusalReasons = []Reason{ReasonWorkflowCompleted, ReasonWorkflowDeleted, ReasonWorkflowReplaced, ReasonWorkflowSucceeded, ReasonTaskSetOwnerGone}

// source says how the guard knew the workflow's state.
type source string

const (
	sourceNone  source = ""
	sourceStore source = "store"
	sourceLive  source = "live-read"
)

// objectKind is the kind of object an admission request is about: the metric label and the
// audit annotation `kind`.
type objectKind string

const (
	kindPod     objectKind = "Pod"
	kindTaskSet objectKind = argo.TaskSetKind
	kindEvent   objectKind = "Event"
)

// role says what part of a workflow an object runs.
type role string

const (
	roleExitHandler role = "exit-handler"
	roleHook        role = "lifecycle-hook"
	roleStep        role = "step"
	// roleAgent is Argo's agent pod, which runs the workflow's HTTP and plugin templates:
	// exit handlers too. Argo creates it only while the workflow runs and deletes it when the
	// workflow completes, so an agent pod for a completed workflow comes from a stale copy.
	roleAgent role = "agent"
	// roleTaskWrite is a WorkflowTaskSet write: it hands the agent tasks to run.
	roleTaskWrite role = "task-write"
	// roleFailureClaim is an Event about a workflow: it may say that the workflow failed.
	roleFailureClaim role = "failure-claim"
)

// facts is what the guard reads from the object of a request, whatever its kind: what decide
// needs, and the object itself (its name, and the words of its kind) for the answer and the
// audit.
type facts struct {
	object    object
	namespace string
	// owner is the Workflow the object names as its owner (a pod's controller reference, a
	// TaskSet's owner reference); nil when there is none.
	owner *metav1.OwnerReference
	role  role
	// component is a pod's workflows.argoproj.io/component label.
	component string
	// startsWork: the object is one the policy judges: a TaskSet write that hands the agent
	// work (adds a task or sets the completed label back), an Event that says the workflow
	// failed. Pods always start work.
	startsWork bool
	// update: the request changes an object that exists (its owner references are those it
	// already had), rather than creating one.
	update bool
	// dryRun: the request will not be persisted; received: when the guard received it.
	dryRun   bool
	received time.Time
	// requester is the user the request was sent for (request.userInfo.username), and
	// unexpected says it is not Options.ExpectedRequester.
	requester  string
	unexpected bool
}

// decision is the guard's verdict on one object, before the mode is applied.
type decision struct {
	deny   bool
	reason Reason
	// row is the row of docs/decisions.md that decided.
	row    string
	source source
	// The owning workflow, when there is one.
	wfNamespace, wfName string
	wfUID               types.UID
	phase               argo.Phase
	resourceVersion     string
	// liveErr is the live read's failure, when the store decided instead.
	liveErr error
	// nameHolder is the UID of the workflow a live read found under the owner's name, when
	// it is another workflow (row 9), and nameHolderDone says it has completed.
	nameHolder     types.UID
	nameHolderDone bool
}

// decide is the decision table of docs/decisions.md, read top to bottom: every return names
// its row. The rows before the live read answer from the request alone, and differ by kind;
// from row 5 on every kind is decided alike, by its workflow.
func (g *guard) decide(ctx context.Context, f facts) decision {
	spec := f.object.spec()
	if f.owner == nil {
		return decision{reason: ReasonNotOwnedByWorkflow, row: spec.rowNotOwned}
	}
	d := decision{wfNamespace: f.namespace, wfName: f.owner.Name, wfUID: f.owner.UID}
	switch {
	case f.component != "" && f.component != argo.ComponentAgent:
		// Artifact-GC pods run after completion by design.
		d.reason, d.row = ReasonArtifactGCOrOtherComponent, "2"
		return d
	case g.watched != nil && !g.watched[f.namespace]:
		d.reason, d.row = ReasonNamespaceNotWatched, spec.rowNotWatched
		return d
	case !f.startsWork:
		d.reason, d.row = spec.idleReason, spec.rowIdle
		return d
	case f.role == roleFailureClaim:
		// Rows E4 to E12.
		return g.judgeClaim(ctx, f, d)
	case !g.covered(f.role):
		d.reason, d.row = ReasonNotCoveredByPolicy, "4"
		return d
	case g.repeatsAdmittedCreate(f, d):
		// Row T7 (checked before T4): no read; not remembered again, so that a TaskSet
		// pending longer than --taskset-repeats-for is read again. Told apart afterwards if
		// it came after the name's reuse (repeats).
		d.reason, d.row = ReasonRepeatsAdmittedCreate, "T7"
		if !f.dryRun {
			g.repeats.note(types.NamespacedName{Namespace: d.wfNamespace, Name: d.wfName}, d.wfUID, f.object.(*taskSetObject).name, f.received)
		}
		return d
	}
	// Exit handlers get a live read first unless store-first is set; ordinary step pods
	// (strict mode) always go store-first, so that the common case costs no API call.
	storeFirst := g.opts.StoreFirst || f.role == roleStep
	if storeFirst && g.store.WatchFresh() {
		// A record the store has forgotten (its TTL) is recalled from the informer, which
		// holds every workflow that exists.
		rec, ok := g.store.Recall(ctx, d.wfUID, d.wfNamespace, d.wfName)
		if !ok {
			d.reason, d.row, d.source = ReasonNotSeenCompleted, "16", sourceStore
			return d
		}
		if fromStore := g.fromRecord(d, rec, "17"); !fromStore.deny && rec.Phase != argo.PhaseUnsettled {
			g.noteCreate(f, fromStore)
			return fromStore
		}
		// Row 18: the store says refuse, or cannot tell: be sure first.
	}
	// Row 19 (store-first with a stale watch) and every other covered object: read live.
	d = g.liveDecide(ctx, f, d)
	g.noteCreate(f, d)
	if f.role == roleTaskWrite && f.update && d.deny &&
		(d.reason == ReasonWorkflowReplaced || d.reason == ReasonWorkflowDeleted && d.source == sourceStore) {
		// Row T5: an update of a TaskSet whose owner is gone, perhaps by the workflow that
		// reused its name (a live 404 stays row 8: no workflow holds the name to write).
		d.reason, d.row = ReasonTaskSetOwnerGone, "T5"
		if d.nameHolder != "" && g.nameHolderWrote(ctx, f, d) {
			// Row T6: the workflow that holds the name sent it.
			d.deny, d.reason, d.row = false, ReasonTasksOfNameHolder, "T6"
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
	ts, ok := f.object.(*taskSetObject)
	if !ok {
		return
	}
	key := ts.key()
	switch {
	case d.deny:
		g.creates.forget(key, d.wfUID)
	case !f.update && !f.dryRun && !f.unexpected && d.reason == ReasonWorkflowNotTerminal:
		g.creates.note(key, d.wfUID, f.requester, ts.templates, f.received, d.source == sourceLive)
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
	ts, ok := f.object.(*taskSetObject)
	if !ok || f.update || !g.creates.repeats(ts.key(), d.wfUID, f.requester, ts.templates) {
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
	ts, ok := f.object.(*taskSetObject)
	if !ok {
		return false
	}
	if d.nameHolderDone {
		return false
	}
	if _, templates := ts.handed(); g.creates.covers(ts.key(), d.nameHolder, f.requester, templates) {
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
	ts, ok := f.object.(*taskSetObject)
	if !ok {
		return false
	}
	tasks, _ := ts.handed()
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
		if !ok || n.Type != argo.NodeTypeHTTP && n.Type != argo.NodeTypePlugin || !n.Pending() || n.InExitHandlerOrHook() {
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

// judgeClaim decides an Event that says its workflow failed (rows E4 to E12). It refuses
// only a claim that the workflow, by UID, contradicts: Succeeded, read live, or, with no live
// answer, as the store knows it. A workflow that is running (a real failure's Event can reach
// the API server before the write that marks it), that failed, that cannot be read, or that is
// gone without a tombstone of a Succeeded workflow, keeps its Event.
func (g *guard) judgeClaim(ctx context.Context, f facts, d decision) decision {
	wf, err := g.read(ctx, d.wfNamespace, d.wfName, g.eventRead)
	switch {
	case err == nil && wf.UID == d.wfUID:
		g.store.Observe(completionstore.ObservationOf(wf, false))
		d.source, d.phase, d.resourceVersion = sourceLive, wf.Status.Phase, wf.ResourceVersion
		switch {
		case d.phase == argo.PhaseSucceeded:
			d.deny, d.reason, d.row = true, ReasonWorkflowSucceeded, "E4"
		case !d.phase.Terminal():
			d.reason, d.row = ReasonWorkflowNotTerminal, "E5"
		default:
			d.reason, d.row = ReasonClaimMatchesPhase, "E6"
		}
		return d
	case err == nil, apierrors.IsNotFound(err):
		// Gone (or its name reused): only a tombstone of a Succeeded workflow refuses.
		if rec, ok := g.store.Get(d.wfUID); ok && rec.Deleted && rec.Phase == argo.PhaseSucceeded {
			d.deny, d.reason, d.row, d.source = true, ReasonWorkflowSucceeded, "E7", sourceStore
			d.phase, d.resourceVersion = rec.Phase, rec.ResourceVersion
			return d
		}
		d.reason, d.row, d.source = ReasonWorkflowGone, "E8", sourceLive
		return d
	}
	d.liveErr = err
	rec, ok := g.store.Recall(ctx, d.wfUID, d.wfNamespace, d.wfName)
	if !ok {
		d.reason, d.row = ReasonUnverifiedFailOpen, "E12"
		return d
	}
	d.source, d.phase, d.resourceVersion = sourceStore, rec.Phase, rec.ResourceVersion
	switch {
	case rec.Deleted && rec.Phase == argo.PhaseSucceeded:
		d.deny, d.reason, d.row = true, ReasonWorkflowSucceeded, "E9"
	case !rec.Deleted && rec.Phase == argo.PhaseSucceeded:
		// The store's completion may be a retry not yet delivered, as for pods.
		d.reason, d.row = ReasonUnconfirmedCompletion, "E10"
		if g.storeCompletionRefuses(f) {
			d.deny, d.reason = true, ReasonWorkflowSucceeded
		}
	case rec.Deleted:
		d.reason, d.row = ReasonWorkflowGone, "E11"
	case rec.Phase == argo.PhaseUnsettled:
		d.reason, d.row = ReasonUnverifiedFailOpen, "E11"
	case !rec.Phase.Terminal():
		d.reason, d.row = ReasonWorkflowNotTerminal, "E11"
	default:
		d.reason, d.row = ReasonClaimMatchesPhase, "E11"
	}
	return d
}

// storeCompletionRefuses says whether a completion that only the store holds (no live read
// answered) may refuse the object of f, as --store-fallback says: never (tombstone), always
// (completion), (requeue, the default) always for a pod Argo's controller creates again on its
// next pass (requeuedWhenRefused) and otherwise as fresh, or (fresh) for an object a retry sends only after re-running nodes (an
// exit-handler pod, a WorkflowFailed Event, a TaskSet write that adds only the workflow's
// exit-handler task) while the store is close behind the API server: the newest write it is
// known to hold (of the object's namespace, with a watch per namespace) was written less than
// --store-fresh-for ago (Store.StalenessIn), so a retry it lacks was written since. A retry
// that re-runs other nodes first (pods: seconds) sends its exit handler after the watch has
// delivered it; one that re-runs the exit handler alone (`argo retry --restart-successful
// --node-field-selector`, 3.6 and later) sends it within a second, and is refused wrongly: a
// 429, which Argo's controller tries again on its next pass, and a refusal the guard notices
// (overturned.go). A retry's agent pod, its TaskSet writes of other nodes, its hook and step
// pods come at once, before any watch could have delivered the retry: those the store alone
// never refuses.
func (g *guard) storeCompletionRefuses(f facts) bool {
	switch g.opts.StoreFallback {
	case FallbackCompletion:
		return true
	case FallbackRequeue:
		if requeuedWhenRefused(f) {
			return true
		}
		fallthrough
	case FallbackFresh:
		stale, ok := g.store.StalenessIn(f.namespace)
		return comesAfterReRunNodes(f) && ok && stale < g.opts.StoreFreshFor
	}
	return false
}

// requeuedWhenRefused says whether Argo's controller creates the object of f again on its
// next pass when the guard refuses it: the pods of a workflow's nodes, which createWorkflowPod
// sends (a 429 is transient on every line: requeueIfTransientErr leaves the node Pending and
// requeues the workflow). Not an agent pod (v3.4 makes the workflow Error on any create
// error), a TaskSet write (logged, written again only when the workflow is woken) or an Event
// (dropped).
func requeuedWhenRefused(f facts) bool {
	switch f.role {
	case roleExitHandler, roleHook, roleStep:
		return true
	}
	return false
}

// comesAfterReRunNodes says whether a retried workflow sends the object of f only after its
// re-run nodes are done.
func comesAfterReRunNodes(f facts) bool {
	switch f.role {
	case roleExitHandler, roleFailureClaim:
		return true
	case roleTaskWrite:
		ts, ok := f.object.(*taskSetObject)
		return ok && ts.onlyExitHandlerTask()
	}
	return false
}

// covered says whether the policy concerns objects of role r.
func (g *guard) covered(r role) bool {
	switch r {
	case roleExitHandler, roleAgent, roleTaskWrite:
		return true
	case roleHook:
		return g.opts.Hooks || g.opts.Strict
	default:
		return g.opts.Strict
	}
}

// read is the live read of a decision: readLive, unless the decision was shed (errDecisionShed).
func (g *guard) read(ctx context.Context, namespace, name string, p readPolicy) (*argo.Workflow, error) {
	if shed(ctx) {
		return nil, errDecisionShed
	}
	return g.readLive(ctx, namespace, name, p)
}

// liveDecide reads the owner from the API server and decides from what it says (rows 5 to 9),
// or from the store when the read fails or runs out of time (rows 10 to 15).
func (g *guard) liveDecide(ctx context.Context, f facts, d decision) decision {
	wf, err := g.read(ctx, d.wfNamespace, d.wfName, g.podRead)
	switch {
	case apierrors.IsNotFound(err):
		d.deny, d.reason, d.row, d.source = true, ReasonWorkflowDeleted, "8", sourceLive
		return d
	case err != nil:
		d.liveErr = err
		rec, ok := g.store.Recall(ctx, d.wfUID, d.wfNamespace, d.wfName)
		if !ok {
			d.reason, d.row = ReasonUnverifiedFailOpen, "15"
			return d
		}
		d = g.fromRecord(d, rec, "")
		if d.deny && d.reason == ReasonWorkflowCompleted && !g.storeCompletionRefuses(f) {
			// The store's completion may be a retry not yet delivered: not sure enough.
			d.deny, d.reason = false, ReasonUnconfirmedCompletion
		}
		return d
	case wf.UID != d.wfUID:
		// The name now belongs to another workflow: the object's owner was deleted.
		d.deny, d.reason, d.row, d.source = true, ReasonWorkflowReplaced, "9", sourceLive
		d.nameHolder, d.nameHolderDone = wf.UID, wf.Status.Phase.Terminal()
		return d
	}
	// A consistent read is the truth; let the store learn from it too (it keeps the newest).
	g.store.Observe(completionstore.ObservationOf(wf, false))
	d.source, d.phase, d.resourceVersion = sourceLive, wf.Status.Phase, wf.ResourceVersion
	switch {
	case !d.phase.Terminal():
		d.reason, d.row = ReasonWorkflowNotTerminal, "5"
	case g.denyPhases[d.phase]:
		d.deny, d.reason, d.row = true, ReasonWorkflowCompleted, "6"
	default:
		d.reason, d.row = ReasonPhaseNotDenied, "7"
	}
	return d
}

// fromRecord decides from what the store holds: rows 10 to 14 when no live read answered, or,
// with row set, the store-first row 17 (the caller reads live before a refusal).
func (g *guard) fromRecord(d decision, rec completionstore.Record, row string) decision {
	d.source, d.phase, d.resourceVersion = sourceStore, rec.Phase, rec.ResourceVersion
	pick := func(fallback string) string {
		if row != "" {
			return row
		}
		return fallback
	}
	switch {
	case rec.Deleted:
		d.deny, d.reason, d.row = true, ReasonWorkflowDeleted, pick("10")
	case rec.Phase == argo.PhaseUnsettled:
		// Seen without its status, and its labels did not tell its phase.
		d.reason, d.row = ReasonUnverifiedFailOpen, pick("14")
	case !rec.Phase.Terminal():
		d.reason, d.row = ReasonWorkflowNotTerminal, pick("13")
	case g.denyPhases[rec.Phase]:
		d.deny, d.reason, d.row = true, ReasonWorkflowCompleted, pick("11")
	default:
		d.reason, d.row = ReasonPhaseNotDenied, pick("12")
	}
	return d
}
