package webhook

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// The Event's own rows of docs/decisions.md, E4 to E12 (eventSpec's hook before the read): an
// Event that says its workflow failed is judged by a read of its own.

// eventBeforeRead decides every Event that says its workflow failed (judgeClaim).
func (g *guard) eventBeforeRead(ctx context.Context, f facts, d decision) (decision, bool) {
	return g.judgeClaim(ctx, f, d), true
}

// judgeClaim decides an Event that says its workflow failed (rows E4 to E12). It refuses
// only a claim that the workflow, by UID, contradicts: Succeeded, read live, or, with no live
// answer, as the store knows it. A workflow that is running (a real failure's Event can reach
// the API server before the write that marks it), that failed, that cannot be read, or that is
// gone without a tombstone of a Succeeded workflow, keeps its Event.
func (g *guard) judgeClaim(ctx context.Context, f facts, d decision) decision {
	wf, err := g.read(ctx, d.wfNamespace, d.wfName, g.readPolicyOf(f))
	switch {
	case err == nil && wf.UID == d.wfUID:
		g.store.Observe(completionstore.ObservationOf(wf, false))
		// A live answer ends the store's run of refusals on its own, as a pod's does.
		g.overturns.answeredLive(d.wfUID)
		d.source, d.phase, d.resourceVersion = sourceLive, wf.Status.Phase, wf.ResourceVersion
		switch {
		case d.phase == argo.PhaseSucceeded:
			d.deny, d.reason, d.row = true, contract.ReasonWorkflowSucceeded, "E4"
		case !d.phase.Terminal():
			d.reason, d.row = contract.ReasonWorkflowNotTerminal, "E5"
		default:
			d.reason, d.row = contract.ReasonClaimMatchesPhase, "E6"
		}
		return d
	case err == nil, apierrors.IsNotFound(err):
		// Gone (or its name reused): only a tombstone of a Succeeded workflow refuses.
		if rec, ok := g.store.Get(d.wfUID); ok && rec.Deleted && rec.Phase == argo.PhaseSucceeded {
			d.deny, d.reason, d.row, d.source = true, contract.ReasonWorkflowSucceeded, "E7", sourceStore
			d.phase, d.resourceVersion = rec.Phase, rec.ResourceVersion
			return d
		}
		d.reason, d.row, d.source = contract.ReasonWorkflowGone, "E8", sourceLive
		return d
	}
	d.liveErr = err
	rec, ok := g.store.Recall(ctx, d.wfUID, d.wfNamespace, d.wfName)
	if !ok {
		d.reason, d.row = contract.ReasonUnverifiedFailOpen, "E12"
		return d
	}
	d.source, d.phase, d.resourceVersion, d.writtenAt = sourceStore, rec.Phase, rec.ResourceVersion, rec.WrittenAt
	switch {
	case rec.Deleted && rec.Phase == argo.PhaseSucceeded:
		d.deny, d.reason, d.row = true, contract.ReasonWorkflowSucceeded, "E9"
	case !rec.Deleted && rec.Phase == argo.PhaseSucceeded:
		// The store's completion may be a retry not yet delivered, as for pods.
		d.reason, d.row = contract.ReasonUnconfirmedCompletion, "E10"
		if g.storeCompletionRefuses(f) {
			d.deny, d.reason = true, contract.ReasonWorkflowSucceeded
		}
	case rec.Deleted:
		d.reason, d.row = contract.ReasonWorkflowGone, "E11"
	case rec.Phase == argo.PhaseUnsettled:
		d.reason, d.row = contract.ReasonUnverifiedFailOpen, "E11"
	case !rec.Phase.Terminal():
		d.reason, d.row = contract.ReasonWorkflowNotTerminal, "E11"
	default:
		d.reason, d.row = contract.ReasonClaimMatchesPhase, "E11"
	}
	return d
}
