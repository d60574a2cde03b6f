package webhook

import (
	"context"
	"fmt"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/contract"
)

// Verdicts: a decision with the mode applied, as in metrics and audit annotations.
const (
	verdictAllowed = "allowed"
	verdictDenied  = "denied"
	verdictWarned  = "warned"
	verdictDryRun  = "dry-run"
)

// verdictOf applies the mode to a decision. It is the one place the mode is applied: a
// refusal is denied in enforce mode, warned of in warn mode, and only recorded in dry-run mode.
func verdictOf(d decision, mode Mode) string {
	if !d.deny {
		return verdictAllowed
	}
	return denyVerdict(mode)
}

// denyVerdict is the verdict a refusal gets in mode.
func denyVerdict(mode Mode) string {
	switch mode {
	case ModeEnforce:
		return verdictDenied
	case ModeWarn:
		return verdictWarned
	default:
		return verdictDryRun
	}
}

// answer is the admission response for a verdict: an admission with its reason; a refusal
// (code 429, refusalCode, the reason code in its causes); or, in warn and dry-run mode, an admission that
// marks the object on the mutating path, and warns in warn mode or where it cannot mark. Every
// answer carries the audit annotations.
func (h *handler) answer(ctx context.Context, f facts, d decision, verdict string) admission.Response {
	var r admission.Response
	switch verdict {
	case verdictAllowed:
		r = admission.Allowed(string(d.reason))
	case verdictDenied:
		r = refusal(f, d)
	default:
		msg := denialMessage(f, d)
		r = admission.Allowed(string(d.reason))
		var patch []jsonpatch.Operation
		if m, ok := f.object.(marker); ok {
			patch = m.mark(msg)
		}
		if h.mutating {
			r.Patches = patch
		}
		if verdict == verdictWarned || patch == nil {
			r = r.WithWarnings(fmt.Sprintf("exit-guard (%s mode) would refuse this %s: %s", h.opts.Mode, f.object.spec().noun, msg))
		}
	}
	r.AuditAnnotations = auditAnnotations(f, d, verdict)
	if verdict == verdictDenied {
		return policyDenial(ctx, r)
	}
	return r
}

// The status of every refusal: code 429 with reason TooManyRequests, and no
// details.retryAfterSeconds. Argo's controller (util/errors.IsTransientErr, in v3.4 to v4.0)
// takes a 429 as transient by its code alone: a refused step or exit-handler pod leaves its node
// Pending and requeues the workflow (requeueIfTransientErr), where a 403 would make the node
// Error and carry a stale pass on to a terminal phase (a WorkflowFailed Event, phase metrics),
// and would lose a real exit handler that the guard refused wrongly. The API server keeps a
// denying webhook's code and reason (k8s.io/apiserver webhook/errors.ToStatusErr) and sends
// Retry-After only from retryAfterSeconds; without that header client-go does not retry a 429
// inside the call (rest/with_retry.go checkWait), so Argo's worker is never held. docs/decisions.md
// says why this code and not another.
const (
	refusalCode   = http.StatusTooManyRequests
	refusalReason = metav1.StatusReasonTooManyRequests
)

// refusal is the guard's refusal: code 429, reason TooManyRequests (refusalCode), which
// ServeHTTP answers in an HTTP 200; the reason code travels in Status.details.causes, which the
// API server hands to the client.
func refusal(f facts, d decision) admission.Response {
	r := admission.Denied(denialMessage(f, d))
	r.Result.Code, r.Result.Reason = refusalCode, refusalReason
	r.Result.Details = &metav1.StatusDetails{Causes: []metav1.StatusCause{{
		Type: metav1.CauseType(d.reason), Field: contract.CauseField, Message: workflowText(f, d),
	}}}
	return r
}

// denialMessage says what happened, which workflow and phase, and where to look.
func denialMessage(f facts, d decision) string {
	if w := f.object.spec().own[d.reason]; w.message != nil {
		return w.message(f, d)
	}
	return fmt.Sprintf("exit-guard refused %s: %s, as seen by %s; "+
		"a stale copy of a completed workflow tried to %s. "+
		"See the workflow's events: kubectl -n %s get events --field-selector involvedObject.name=%s",
		f.object.refused(), workflowText(f, d), d.source, f.object.spec().retried, d.wfNamespace, d.wfName)
}

// workflowText says what the guard knows of the workflow a refusal is about.
func workflowText(f facts, d decision) string {
	if w := f.object.spec().own[d.reason]; w.workflow != nil {
		return w.workflow(d)
	}
	switch d.reason {
	case contract.ReasonWorkflowDeleted:
		return fmt.Sprintf("workflow %s/%s (uid %s) no longer exists", d.wfNamespace, d.wfName, d.wfUID)
	case contract.ReasonWorkflowReplaced:
		return fmt.Sprintf("workflow %s/%s (uid %s) was deleted; that name now belongs to another workflow", d.wfNamespace, d.wfName, d.wfUID)
	default:
		return fmt.Sprintf("workflow %s/%s (uid %s) already reached %s (resourceVersion %s)", d.wfNamespace, d.wfName, d.wfUID, d.phase, d.resourceVersion)
	}
}

// auditAnnotations are the annotations that the API server writes into its audit log, under
// the webhook's name.
func auditAnnotations(f facts, d decision, verdict string) map[string]string {
	a := map[string]string{"decision": verdict, "reason": string(d.reason), "kind": string(f.object.spec().kind)}
	if f.owner != nil {
		a["workflow"] = d.wfNamespace + "/" + d.wfName
		a["workflow-uid"] = string(d.wfUID)
	}
	f.object.annotate(a)
	if d.source != sourceNone {
		a["source"] = string(d.source)
	}
	if d.phase != "" {
		a["phase"] = string(d.phase)
	}
	if d.deny && f.unexpected && !f.dryRun {
		a["requester"] = "unexpected"
	}
	return a
}
