package webhook

import (
	"context"
	"errors"
	"net/http"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// handler is the one admission pipeline that every path runs, whatever the kind of object:
// read the request into facts, decide, apply the mode (the verdict), audit, answer.
type handler struct {
	*guard
	// readObject turns a request of the path's kind into facts, or answers it: allowed for a
	// request that is not ours, 400 for a malformed one.
	readObject func(admission.Request) (facts, *admission.Response)
	// mutating: the path marks the suspect objects it admits (the pod path of warn and dry-run
	// mode).
	mutating bool
}

var _ admission.Handler = (*handler)(nil)

// Handle decides one admission request.
func (h *handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	received := time.Now()
	f, resp := h.readObject(req)
	if resp != nil {
		return *resp
	}
	f.dryRun, f.received = req.DryRun != nil && *req.DryRun, received
	f.requester, f.unexpected = req.UserInfo.Username, h.unexpectedRequester(req)
	ctx, release := h.admit(ctx, f.unexpected)
	defer release()
	d := h.decide(ctx, f)
	v := verdictOf(d, h.opts.Mode)
	h.audit(ctx, req, f, d, v)
	return h.answer(ctx, f, d, v)
}

// checkUID answers a request that has no uid (the API server always sets one) with a 400.
func checkUID(req admission.Request) *admission.Response {
	if req.UID == "" {
		r := admission.Errored(http.StatusBadRequest, errors.New("malformed AdmissionReview: request.uid is empty"))
		return &r
	}
	return nil
}

// resourceName names the resource of a request, for the answers to requests that are not ours.
func resourceName(req admission.Request) string {
	r := req.Resource.Resource
	if req.Resource.Group != "" {
		r += "." + req.Resource.Group
	}
	if req.SubResource != "" {
		r += "/" + req.SubResource
	}
	return r
}
