package webhook

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// handler is the one admission pipeline that every path runs, whatever the kind of object:
// decode the review once and read its object into facts, decide, apply the mode (the
// verdict), audit, answer. Its HTTP side is in http.go, its decoding in decode.go.
type handler struct {
	*guard
	// read decodes a review of the path's kind and turns its request into facts, or answers
	// it: allowed for a request that is not ours, 400 for a malformed one (readReview).
	read func([]byte) (request, facts, *admission.Response)
	// mutating: the path marks the suspect objects it admits (the pod path of warn and dry-run
	// mode).
	mutating bool
	// readOnly, when set, is the admission of every request that reads: the mutating path in
	// enforce mode, where the validating path decides.
	readOnly string
	// log is the path's logger, which the audit reads from the request's context.
	log logr.Logger
}

// handle decides the review in body; req is filled as soon as the review is read.
func (h *handler) handle(ctx context.Context, body []byte, req *request) admission.Response {
	received := time.Now()
	r, f, resp := h.read(body)
	*req = r
	switch {
	case resp != nil:
		return *resp
	case h.readOnly != "":
		return admission.Allowed(h.readOnly)
	}
	f.dryRun, f.received = r.dryRun, received
	f.requester, f.unexpected = r.username, h.unexpectedRequester(r)
	ctx, release := h.admit(ctx, f.unexpected)
	defer release()
	d := h.decide(ctx, f)
	v := verdictOf(d, h.opts.Mode)
	h.audit(ctx, r, f, d, v)
	if v == verdictDenied && !f.dryRun && !f.unexpected {
		h.overturns.note(f, d)
	}
	answer := h.answer(ctx, f, d, v)
	h.metrics.decisionTime.WithLabelValues(string(f.role)).Observe(time.Since(received).Seconds())
	if o, ok := f.object.(executorImager); ok && h.observesRelease(f) {
		h.argo.observe(o.executorImage())
	}
	if f.dryRun {
		// exit-guard check and helm test print it: what the guard saw of Argo's release.
		if w := h.argo.summary(); w != "" {
			answer.Warnings = append(answer.Warnings, w)
		}
	}
	return answer
}

// observesRelease says whether the pod of f may tell which Argo release runs: not a dry run
// (exit-guard check and helm test send their own), and, when the guard knows Argo's controller
// (Options.ExpectedRequester), only a pod that controller sent. A tenant's pod names any image
// it likes.
func (g *guard) observesRelease(f facts) bool { return !f.dryRun && !f.unexpected }

// executorImager is an object that names the image of the Argo executor it runs (a pod), which
// says which Argo release made it (argoVersions).
type executorImager interface{ executorImage() string }

// unexpectedRequester says whether req was sent on behalf of someone other than the workflow
// controller the guard expects (Options.ExpectedRequester; empty: anyone is expected). It reads
// request.userInfo.username, which the API server fills with the authenticated user that made
// the write; a client that can reach the webhook port directly can write any name there,
// unless --webhook-client-ca-file makes the guard answer only the API server.
func (g *guard) unexpectedRequester(req request) bool {
	return g.opts.ExpectedRequester != "" && req.username != g.opts.ExpectedRequester
}
