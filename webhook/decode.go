package webhook

import (
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	sigsjson "sigs.k8s.io/json"
)

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
