package webhook

import (
	"context"
	"errors"
	"unicode/utf8"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// audit records a decision with its verdict: a metric always; a log line (V(1) for
// admissions); for a refusal (or a would-be refusal in warn mode) a Warning Event on the
// workflow, unless the request is a dry run.
func (g *guard) audit(ctx context.Context, req request, f facts, d decision, verdict string) {
	spec := f.object.spec()
	// A refusal for someone other than the expected controller is counted apart: it may be a
	// forged review, which must not raise the alerts on stale exit handlers. A dry run
	// (exit-guard check, helm test, kubectl --dry-run=server) persists nothing and is counted
	// apart too, whoever sent it: an install check must not look like a refused exit handler.
	unexpected := d.deny && f.unexpected && !f.dryRun
	switch {
	case f.dryRun:
		g.metrics.dryRuns.WithLabelValues(verdict, string(d.reason), string(spec.kind)).Inc()
	case unexpected:
		g.metrics.unexpected.WithLabelValues(verdict, string(d.reason), string(spec.kind)).Inc()
	default:
		g.metrics.decisions.WithLabelValues(verdict, string(d.reason), string(spec.kind), sourceLabel(d)).Inc()
	}
	if d.liveErr != nil {
		kind := "error"
		switch {
		case errors.Is(d.liveErr, errLiveReadTimeout):
			kind = "timeout"
		case errors.Is(d.liveErr, errDecisionShed):
			kind = "shed"
		}
		g.metrics.liveReadFailures.WithLabelValues(kind).Inc()
	}

	log := logf.FromContext(ctx)
	unverified := d.reason == contract.ReasonUnverifiedFailOpen || d.reason == contract.ReasonUnconfirmedCompletion
	own := spec.own[d.reason]
	if !d.deny && !unverified && own.log == "" && !log.V(1).Enabled() {
		// The common case: an admission nobody asked to see logged costs no log values.
		return
	}
	log = log.WithValues(f.object.logValues()...)
	log = log.WithValues("reason", d.reason, "row", d.row, "verdict", verdict, "mode", g.opts.Mode, "uid", req.uid)
	if f.owner != nil {
		log = log.WithValues("workflow", d.wfNamespace+"/"+d.wfName, "workflowUID", d.wfUID,
			"phase", d.phase, "resourceVersion", d.resourceVersion, "source", d.source)
	}
	if d.liveErr != nil {
		log = log.WithValues("liveReadError", d.liveErr.Error())
	}
	msgs := &spec.logs
	if !d.deny {
		switch {
		case own.log != "":
			log.Info(own.log)
		case d.reason == contract.ReasonUnverifiedFailOpen:
			log.Info(msgs.unverified)
		case d.reason == contract.ReasonUnconfirmedCompletion:
			log.Info(msgs.unconfirmed)
		default:
			log.V(1).Info(msgs.admitted)
		}
		return
	}
	dryRunRequest := req.dryRun
	refusedMsg := msgs.refused
	if own.log != "" {
		refusedMsg = own.log
	}
	if unexpected {
		log = log.WithValues("requester", f.requester, "expectedRequester", g.opts.ExpectedRequester)
		refusedMsg += " (for a requester that is not the expected workflow controller)"
	}
	log.Info(refusedMsg, "dryRunRequest", dryRunRequest)
	if spec.staleFailure && !dryRunRequest && !unexpected {
		// In every mode: warn and dry-run admit the Event, but the stale pass has counted the
		// workflow's metrics all the same.
		g.metrics.staleFailures.inc(d.wfNamespace, d.wfName)
	}

	if g.recorder == nil || dryRunRequest || verdict == verdictDryRun {
		return
	}
	eventType, reason := spec.auditEvent(verdict, d.reason)
	note := "%s: workflow is %s, known by %s at resourceVersion %s"
	args := []any{f.object.eventRefused(), phaseOrGone(f, d), d.source, d.resourceVersion}
	if unexpected {
		eventType, reason = corev1.EventTypeNormal, contract.EventReasonUnexpectedRequester
		note += "; sent for %q, not the expected workflow controller"
		args = append(args, truncate(f.requester, 128))
	}
	regarding := &argo.Workflow{
		TypeMeta:   metav1.TypeMeta{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: d.wfNamespace, Name: d.wfName, UID: d.wfUID},
	}
	g.recorder.Eventf(regarding, nil, eventType, reason, eventAction(req.operation, spec.kind), note, args...)
}

// eventAction is the action of the guard's Event about an object of kind, which the request
// creates or updates: "CreatePod", "UpdateWorkflowTaskSet".
func eventAction(op admissionv1.Operation, kind objectKind) string {
	if op == admissionv1.Update {
		return "Update" + string(kind)
	}
	return "Create" + string(kind)
}

// phaseOrGone is the workflow's state in the note of the guard's Event.
func phaseOrGone(f facts, d decision) string {
	if w := f.object.spec().own[d.reason]; w.phase != "" {
		return w.phase
	}
	switch d.reason {
	case contract.ReasonWorkflowDeleted:
		return "deleted"
	case contract.ReasonWorkflowReplaced:
		return "deleted (name reused by another workflow)"
	}
	return string(d.phase)
}

// truncate shortens s to at most n bytes (on a rune boundary), marking the cut: an Event's
// note is limited to 1 kB, and a requester's name comes from the request.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
