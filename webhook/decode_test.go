package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/contract"
)

// reviewBody is req in an AdmissionReview, as the API server sends it.
func reviewBody(req admissionv1.AdmissionRequest) []byte {
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: reviewV1, Kind: reviewKind},
		Request:  &req,
	})
	if err != nil {
		panic(err)
	}
	return b
}

// answerOf sends req through h's HTTP side and returns its answer.
func answerOf(t testing.TB, h http.Handler, req admissionv1.AdmissionRequest) admission.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(reviewBody(req)))
	r.Header.Set("Content-Type", reviewBodyFormat)
	h.ServeHTTP(rec, r)
	var rv admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &rv); err != nil || rv.Response == nil {
		// Errorf, not Fatalf: tests call it from goroutines of their own too.
		t.Errorf("HTTP %d with no AdmissionReview (%v): %s", rec.Code, err, rec.Body.Bytes())
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Result: &metav1.Status{}}}
	}
	return admission.Response{AdmissionResponse: *rv.Response}
}

// TestReviewsAreDecodedOnceAndAnsweredInTheirVersion: the review is decoded in one pass with
// the object as its kind needs it, so what the old two-step decoding told apart still is: a
// request that is not ours is allowed whatever its object, one that is gets a 400 naming the
// field that did not decode; the answer repeats the review's version and the request's uid.
func TestReviewsAreDecodedOnceAndAnsweredInTheirVersion(t *testing.T) {
	h := fuzzGuard(t, Options{}).path(ValidatePath, readPodReview)
	notAPod := []byte(`{"metadata":{"labels":["not","a","map"]}}`)
	for _, tc := range []struct {
		name       string
		body       string
		status     int
		apiVersion string
		allowed    bool
		says       string
	}{
		{"a v1beta1 review", `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"b1","resource":{"version":"v1","resource":"pods"},"operation":"CREATE","object":{"metadata":{"name":"p"}}}}`,
			http.StatusOK, reviewV1beta1, true, string(contract.ReasonNotOwnedByWorkflow)},
		{"a review with no version", `{"request":{"uid":"n1","resource":{"version":"v1","resource":"pods"},"operation":"CREATE","object":{"metadata":{"name":"p"}}}}`,
			http.StatusOK, reviewV1, true, string(contract.ReasonNotOwnedByWorkflow)},
		{"a review of another version", `{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview","request":{"uid":"v2"}}`,
			http.StatusBadRequest, reviewV1, false, "is not an AdmissionReview of admission.k8s.io/v1"},
		{"another kind", `{"apiVersion":"admission.k8s.io/v1","kind":"TokenReview","request":{"uid":"k"}}`,
			http.StatusBadRequest, reviewV1, false, "is not an AdmissionReview"},
		{"no request", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`,
			http.StatusBadRequest, reviewV1, false, "request is missing"},
		{"a configmap whose object is no pod", string(reviewBody(admissionv1.AdmissionRequest{UID: "c1", Operation: admissionv1.Create,
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Object: runtime.RawExtension{Raw: notAPod}})),
			http.StatusOK, reviewV1, true, "only reviews pods, not configmaps"},
		{"a pod deletion whose old object is no pod", string(reviewBody(admissionv1.AdmissionRequest{UID: "d1", Operation: admissionv1.Delete,
			Resource: podResource, OldObject: runtime.RawExtension{Raw: notAPod}})),
			http.StatusOK, reviewV1, true, "only reviews pod creation, not DELETE"},
		{"a pod create whose object is no pod", string(reviewBody(admissionv1.AdmissionRequest{UID: "p1", Operation: admissionv1.Create,
			Resource: podResource, Object: runtime.RawExtension{Raw: notAPod}})),
			http.StatusBadRequest, reviewV1, false, "request.object is not a pod: json: cannot unmarshal array into Go struct field"},
		{"a uid that is not a string", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}`,
			http.StatusBadRequest, reviewV1, false, "malformed AdmissionReview: json: cannot unmarshal number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader([]byte(tc.body)))
			r.Header.Set("Content-Type", reviewBodyFormat)
			h.ServeHTTP(rec, r)
			var rv admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &rv); err != nil || rv.Response == nil {
				t.Fatalf("HTTP %d with no AdmissionReview (%v): %s", rec.Code, err, rec.Body.Bytes())
			}
			if rec.Code != tc.status || rv.APIVersion != tc.apiVersion || rv.Kind != reviewKind || rv.Response.Allowed != tc.allowed {
				t.Errorf("HTTP %d, %s %s, allowed %v; want HTTP %d, %s %s, allowed %v: %s", rec.Code, rv.APIVersion, rv.Kind, rv.Response.Allowed,
					tc.status, tc.apiVersion, reviewKind, tc.allowed, rec.Body.Bytes())
			}
			if rv.Response.Result == nil || !strings.Contains(rv.Response.Result.Message, tc.says) {
				t.Errorf("the answer does not say %q: %s", tc.says, rec.Body.Bytes())
			}
			var in struct {
				Request *struct {
					UID types.UID `json:"uid"`
				} `json:"request"`
			}
			if json.Unmarshal([]byte(tc.body), &in) == nil && in.Request != nil && rv.Response.UID != in.Request.UID {
				t.Errorf("answer uid %q, want the request's %q", rv.Response.UID, in.Request.UID)
			}
		})
	}
}
