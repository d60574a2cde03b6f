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
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	admissionmetrics "sigs.k8s.io/controller-runtime/pkg/webhook/admission/metrics"
	sigsjson "sigs.k8s.io/json"
)

// maxReviewSize bounds the body of a request: controller-runtime's limit, which leaves room for
// an object at the API server's own limit (3 MiB in etcd) and its old object, encoded.
const maxReviewSize = 7 << 20

// The AdmissionReview versions the guard answers: v1, which its webhook configurations ask for,
// and v1beta1, whose request and response are the same fields.
const (
	reviewKind       = "AdmissionReview"
	reviewV1         = "admission.k8s.io/v1"
	reviewV1beta1    = "admission.k8s.io/v1beta1"
	reviewBodyFormat = "application/json"
)

// review is the part of an AdmissionReview the guard decodes, the objects of its request as O:
// the part of its kind's object the decision needs. The whole review is decoded in one pass,
// the rest of each object (a pod's spec: most of its bytes) skipped, not kept.
type review[O any] struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Request    *reviewRequest[O] `json:"request"`
}

// reviewRequest is the part of an AdmissionReview's request the guard reads.
type reviewRequest[O any] struct {
	UID         types.UID                   `json:"uid"`
	Resource    metav1.GroupVersionResource `json:"resource"`
	SubResource string                      `json:"subResource"`
	Name        string                      `json:"name"`
	Namespace   string                      `json:"namespace"`
	Operation   admissionv1.Operation       `json:"operation"`
	UserInfo    struct {
		Username string `json:"username"`
	} `json:"userInfo"`
	// Object and OldObject are nil when absent or null.
	Object    *O    `json:"object"`
	OldObject *O    `json:"oldObject"`
	DryRun    *bool `json:"dryRun"`
}

// rawObject decodes nothing: an object of any shape, skipped. It stands for the objects of a
// request whose own decoding failed, to tell a request that is not ours (allowed) from a
// malformed one (400).
type rawObject struct{}

// UnmarshalJSON skips the object.
func (*rawObject) UnmarshalJSON([]byte) error { return nil }

// request is what the pipeline keeps of a request, whatever its kind: what the decision, the
// audit and the answer read besides the facts of its object.
type request struct {
	// apiVersion is the version of the review, which the answer repeats.
	apiVersion string
	uid        types.UID
	operation  admissionv1.Operation
	username   string
	dryRun     bool
}

// readReview returns the reader of a path: it decodes a request body as a review of O and
// hands the request to read, which turns it into facts or answers it (allowed for requests
// that are not ours, 400 for malformed ones); noun names O in the answer to an object that does
// not decode ("a pod").
func readReview[O any](noun string, read func(*reviewRequest[O]) (facts, *admission.Response)) func([]byte) (request, facts, *admission.Response) {
	return func(body []byte) (request, facts, *admission.Response) {
		var rv review[O]
		err := sigsjson.UnmarshalCaseSensitivePreserveInts(body, &rv)
		if err != nil {
			// Was it the object? Decode the review again without it: a request that is not
			// ours is allowed whatever its object, one that is gets a 400 that says so.
			var rest review[rawObject]
			if sigsjson.UnmarshalCaseSensitivePreserveInts(body, &rest) != nil || rest.Request == nil {
				return request{}, facts{}, errored(http.StatusBadRequest, fmt.Errorf("malformed AdmissionReview: %w", err))
			}
			return readAs(&rest, func(r *reviewRequest[rawObject]) (facts, *admission.Response) {
				// The reader sees the request without its objects: it allows one that is not
				// its kind's or operation's, and says nothing of the objects.
				rr := &reviewRequest[O]{UID: r.UID, Resource: r.Resource, SubResource: r.SubResource, Name: r.Name,
					Namespace: r.Namespace, Operation: r.Operation, DryRun: r.DryRun, UserInfo: r.UserInfo}
				if f, resp := read(rr); resp != nil && resp.Allowed {
					return f, resp
				}
				// The decoder's error names the field: request.object… or request.oldObject….
				return facts{}, errored(http.StatusBadRequest, fmt.Errorf("malformed AdmissionReview: request.object is not %s: %w", noun, err))
			})
		}
		return readAs(&rv, read)
	}
}

// readAs checks the review's version and request and reads it.
func readAs[O any](rv *review[O], read func(*reviewRequest[O]) (facts, *admission.Response)) (request, facts, *admission.Response) {
	req := request{apiVersion: rv.APIVersion}
	r := rv.Request
	if r != nil {
		req.uid, req.operation, req.username, req.dryRun = r.UID, r.Operation, r.UserInfo.Username, r.DryRun != nil && *r.DryRun
	}
	switch {
	case rv.APIVersion != "" && rv.APIVersion != reviewV1 && rv.APIVersion != reviewV1beta1,
		rv.Kind != "" && rv.Kind != reviewKind:
		// Answered in v1, the version the guard's webhook configurations ask for.
		req.apiVersion = ""
		return req, facts{}, errored(http.StatusBadRequest,
			fmt.Errorf("malformed AdmissionReview: %s %s is not an AdmissionReview of %s or %s", rv.APIVersion, rv.Kind, reviewV1, reviewV1beta1))
	case r == nil:
		return req, facts{}, errored(http.StatusBadRequest, errors.New("malformed AdmissionReview: request is missing"))
	}
	if r.UID == "" {
		return req, facts{}, errored(http.StatusBadRequest, errors.New("malformed AdmissionReview: request.uid is empty"))
	}
	f, resp := read(r)
	return req, f, resp
}

// errored is admission.Errored as a pointer, for the readers' answers.
func errored(code int32, err error) *admission.Response {
	r := admission.Errored(code, err)
	return &r
}

// allowed is admission.Allowed as a pointer, for the readers' answers to requests that are
// not theirs.
func allowed(reason string) *admission.Response {
	r := admission.Allowed(reason)
	return &r
}

// resourceName names the resource of a request, for the answers to requests that are not ours.
func resourceName(gvr metav1.GroupVersionResource, subResource string) string {
	r := gvr.Resource
	if gvr.Group != "" {
		r += "." + gvr.Group
	}
	if subResource != "" {
		r += "/" + subResource
	}
	return r
}

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
