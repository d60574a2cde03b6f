package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	admissionmetrics "sigs.k8s.io/controller-runtime/pkg/webhook/admission/metrics"
)

// maxReviewSize bounds the body of a request: controller-runtime's limit, which leaves room for
// an object at the API server's own limit (3 MiB in etcd) and its old object, encoded.
const maxReviewSize = 7 << 20

var _ http.Handler = (*handler)(nil)

// ServeHTTP is the HTTP side of the pipeline: it reads the body, decodes the review once
// (h.read), runs the pipeline, and writes the answer with an HTTP status the API server acts
// on: 200 for an admission or one of the guard's own policy refusals; for anything else a
// refusal would be read as a denial whatever the webhook's failurePolicy, so a malformed
// request gets HTTP 400 (or 413) and anything else (a panic, any future bug) HTTP 500, and the
// API server applies the failurePolicy.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mark := &policyMark{}
	ctx := context.WithValue(r.Context(), policyMarkKey{}, mark)
	ctx = logf.IntoContext(ctx, h.log)
	req, resp := h.serve(ctx, r)
	status := http.StatusOK
	switch code := resp.Result.Code; {
	case resp.Allowed:
	case mark.denied && code == refusalCode:
		// The guard's own policy refusal.
	case code >= 400 && code < 600 && code != refusalCode:
		status = int(code)
	default:
		status = http.StatusInternalServerError
	}
	apiVersion := req.apiVersion
	if apiVersion == "" {
		apiVersion = reviewV1
	}
	out, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: apiVersion, Kind: reviewKind}, Response: &resp.AdmissionResponse})
	if err != nil {
		h.log.Error(err, "encoding the answer")
		status, out = http.StatusInternalServerError, []byte(`{"apiVersion":"`+reviewV1+`","kind":"`+reviewKind+`","response":{"uid":"","allowed":false,"status":{"code":500,"message":"exit-guard could not encode its answer"}}}`)
	}
	w.Header().Set("Content-Type", reviewBodyFormat)
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

// serve reads and decides one request; a panic anywhere on the way is answered with a 500.
func (h *handler) serve(ctx context.Context, r *http.Request) (req request, resp admission.Response) {
	defer func() {
		if p := recover(); p != nil {
			admissionmetrics.WebhookPanics.WithLabelValues().Inc()
			h.guard.metrics.panics.WithLabelValues(panicAdmission).Inc()
			h.log.Error(fmt.Errorf("panic: %v", p), "the admission pipeline panicked; answered with HTTP 500", "uid", req.uid, "stack", string(debug.Stack()))
			resp = admission.Errored(http.StatusInternalServerError, fmt.Errorf("panic: %v [recovered]", p))
			resp.UID = req.uid
		}
	}()
	if r.Body == nil || r.Body == http.NoBody {
		return req, admission.Errored(http.StatusBadRequest, errors.New("request body is empty"))
	}
	defer func() { _ = r.Body.Close() }()
	limited := &io.LimitedReader{R: r.Body, N: maxReviewSize}
	body, err := io.ReadAll(limited)
	switch {
	case err != nil:
		return req, admission.Errored(http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err))
	case limited.N <= 0:
		return req, admission.Errored(http.StatusRequestEntityTooLarge, fmt.Errorf("request entity is too large; limit is %d bytes", maxReviewSize))
	case len(body) == 0:
		return req, admission.Errored(http.StatusBadRequest, errors.New("request body is empty"))
	}
	if ct := r.Header.Get("Content-Type"); ct != reviewBodyFormat {
		return req, admission.Errored(http.StatusBadRequest, fmt.Errorf("contentType=%s, expected %s", ct, reviewBodyFormat))
	}
	resp = h.handle(ctx, body, &req)
	resp.UID = req.uid
	return req, completed(resp)
}

// completed fills what every answer carries: a status code, and the patch in its encoded form.
func completed(r admission.Response) admission.Response {
	if r.Result == nil {
		r.Result = &metav1.Status{}
	}
	if r.Result.Code == 0 {
		r.Result.Code = http.StatusOK
	}
	if len(r.Patches) > 0 {
		patch, err := json.Marshal(r.Patches)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encoding the patch: %w", err))
		}
		pt := admissionv1.PatchTypeJSONPatch
		r.Patch, r.PatchType = patch, &pt
	}
	return r
}

// policyMark is put in each request's context by ServeHTTP; the pipeline sets it when it
// answers with one of its own policy refusals, and only then.
type policyMark struct{ denied bool }

type policyMarkKey struct{}

// policyDenial marks r as the guard's own policy refusal and returns it. It is the last thing
// the pipeline does, so a panic on the way to a refusal leaves the mark unset.
func policyDenial(ctx context.Context, r admission.Response) admission.Response {
	if m, ok := ctx.Value(policyMarkKey{}).(*policyMark); ok {
		m.denied = true
	}
	return r
}
