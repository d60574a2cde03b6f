package webhook

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// decide is the decision table of docs/decisions.md, read top to bottom: every return names
// its row. The rows before the live read answer from the request alone, and differ by kind
// (its kindSpec); a kind's hooks add its own rows before the read (beforeRead) and after it
// (afterRead); from row 5 on every kind is decided alike, by its workflow.
func (g *guard) decide(ctx context.Context, f facts) decision {
	spec := f.object.spec()
	if f.owner == nil {
		return decision{reason: contract.ReasonNotOwnedByWorkflow, row: spec.rowNotOwned}
	}
	d := decision{wfNamespace: f.namespace, wfName: f.owner.Name, wfUID: f.owner.UID}
	switch {
	case f.afterCompletion:
		// Its kind says it runs after completion by design (artifact-GC pods).
		d.reason, d.row = contract.ReasonArtifactGCOrOtherComponent, "2"
		return d
	case g.watched != nil && !g.watched[f.namespace]:
		d.reason, d.row = contract.ReasonNamespaceNotWatched, spec.rowNotWatched
		return d
	case !f.startsWork:
		d.reason, d.row = spec.idleReason, spec.rowIdle
		return d
	}
	if spec.beforeRead != nil {
		if kd, ok := spec.beforeRead(g, ctx, f, d); ok {
			return kd
		}
	}
	if spec.covered != nil && !spec.covered(g.opts, f) {
		d.reason, d.row = contract.ReasonNotCoveredByPolicy, "4"
		return d
	}
	after := func(d decision) decision {
		if spec.afterRead == nil {
			return d
		}
		return spec.afterRead(g, ctx, f, d)
	}
	// An object gets a live read first unless store-first is set, or its kind decides its
	// role store-first (roleRule): an exit handler, an agent or a hook is the first pod a
	// stale pass may send, and the guard's own watch may lag like Argo's; ordinary step pods
	// go store-first, so that the common case costs no API call.
	storeFirst := g.opts.StoreFirst || spec.roles[f.role].storeFirst
	if storeFirst && g.store.WatchFreshIn(f.namespace) {
		// A record the store has forgotten (its TTL) is recalled from the informer, which
		// holds every workflow that exists.
		rec, ok := g.store.Recall(ctx, d.wfUID, d.wfNamespace, d.wfName)
		if !ok {
			d.reason, d.row, d.source = contract.ReasonNotSeenCompleted, "16", sourceStore
			return d
		}
		if fromStore := g.fromRecord(d, rec, "17"); !fromStore.deny && rec.Phase != argo.PhaseUnsettled {
			return after(fromStore)
		}
		// Row 18: the store says refuse, or cannot tell: be sure first.
	}
	// Row 19 (store-first with a stale watch) and every other covered object: read live.
	return after(g.liveDecide(ctx, f, d))
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
// pods come at once, before any watch could have delivered the retry: fresh never refuses
// those from the store alone; requeue refuses the pods among them (a hook or step pod, where
// covered: step pods by default), which Argo sends again, so a wrong one is a delay that the
// guard notices like the others.
func (g *guard) storeCompletionRefuses(f facts) bool {
	switch g.opts.StoreFallback {
	case FallbackCompletion:
		return true
	case FallbackRequeue:
		if f.object.requeuedWhenRefused() {
			return true
		}
		fallthrough
	case FallbackFresh:
		stale, ok := g.store.StalenessIn(f.namespace)
		return f.object.comesAfterReRunNodes() && ok && stale < g.opts.StoreFreshFor
	}
	return false
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
	wf, err := g.read(ctx, d.wfNamespace, d.wfName, g.readPolicyOf(f))
	switch {
	case apierrors.IsNotFound(err):
		d.deny, d.reason, d.row, d.source = true, contract.ReasonWorkflowDeleted, "8", sourceLive
		return d
	case err != nil:
		d.liveErr = err
		rec, ok := g.store.Recall(ctx, d.wfUID, d.wfNamespace, d.wfName)
		if !ok {
			d.reason, d.row = contract.ReasonUnverifiedFailOpen, "15"
			return d
		}
		d = g.fromRecord(d, rec, "")
		if d.deny && d.reason == contract.ReasonWorkflowCompleted && !g.storeCompletionRefuses(f) {
			// The store's completion may be a retry not yet delivered: not sure enough.
			d.deny, d.reason = false, contract.ReasonUnconfirmedCompletion
		}
		if d.deny && d.reason == contract.ReasonWorkflowCompleted {
			if refusing, ok := g.overturns.refusingFor(d.wfUID); ok && refusing >= g.opts.StoreRefusalsFor {
				// The store has refused this workflow alone for the whole bound, no live
				// read answering since: a retry it cannot see would wait for as long as
				// the guard stays cut off. It admits, unconfirmed (counted, alerted).
				d.deny, d.reason = false, contract.ReasonUnconfirmedCompletion
				g.overturns.admittedPastBound(d.wfUID)
			}
		}
		return d
	case wf.UID != d.wfUID:
		// The name now belongs to another workflow: the object's owner was deleted.
		d.deny, d.reason, d.row, d.source = true, contract.ReasonWorkflowReplaced, "9", sourceLive
		d.nameHolder, d.nameHolderDone = wf.UID, wf.Status.Phase.Terminal()
		return d
	}
	// A consistent read is the truth; let the store learn from it too (it keeps the newest).
	g.store.Observe(completionstore.ObservationOf(wf, false))
	// And the store's run of refusals on its own, if any, ends here (--store-refusals-for).
	g.overturns.answeredLive(d.wfUID)
	d.source, d.phase, d.resourceVersion = sourceLive, wf.Status.Phase, wf.ResourceVersion
	switch {
	case !d.phase.Terminal():
		d.reason, d.row = contract.ReasonWorkflowNotTerminal, "5"
	case g.denyPhases[d.phase]:
		d.deny, d.reason, d.row = true, contract.ReasonWorkflowCompleted, "6"
	default:
		d.reason, d.row = contract.ReasonPhaseNotDenied, "7"
	}
	return d
}

// readPolicyOf is how the live read of f's workflow is made, as its kind's roleRule says: the
// objects a workflow sends many of (hook and step pods, one after another within one pass of
// Argo's controller) within --hook-step-read-budget, so that none waits more than a second on
// the guard; the rest (an exit-handler or agent pod, a TaskSet write: one or two a workflow)
// within --live-read-budget.
func (g *guard) readPolicyOf(f facts) readPolicy {
	switch f.object.spec().roles[f.role].budget {
	case budgetHookStep:
		return g.hookStepRead
	case budgetEvent:
		return g.eventRead
	}
	return g.podRead
}

// fromRecord decides from what the store holds: rows 10 to 14 when no live read answered, or,
// with row set, the store-first row 17 (the caller reads live before a refusal).
func (g *guard) fromRecord(d decision, rec completionstore.Record, row string) decision {
	d.source, d.phase, d.resourceVersion, d.writtenAt = sourceStore, rec.Phase, rec.ResourceVersion, rec.WrittenAt
	pick := func(fallback string) string {
		if row != "" {
			return row
		}
		return fallback
	}
	switch {
	case rec.Deleted:
		d.deny, d.reason, d.row = true, contract.ReasonWorkflowDeleted, pick("10")
	case rec.Phase == argo.PhaseUnsettled:
		// Seen without its status, and its labels did not tell its phase.
		d.reason, d.row = contract.ReasonUnverifiedFailOpen, pick("14")
	case !rec.Phase.Terminal():
		d.reason, d.row = contract.ReasonWorkflowNotTerminal, pick("13")
	case g.denyPhases[rec.Phase]:
		d.deny, d.reason, d.row = true, contract.ReasonWorkflowCompleted, pick("11")
	default:
		d.reason, d.row = contract.ReasonPhaseNotDenied, pick("12")
	}
	return d
}
