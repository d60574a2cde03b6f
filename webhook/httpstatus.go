package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// policyMark is put in each request's context by withHTTPStatus; the validator sets it when it
// answers with one of its own policy refusals, and only then.
type policyMark struct{ denied bool }

type policyMarkKey struct{}

// policyDenial marks r as the guard's own policy refusal and returns it. It is the last thing
// the validator does, so a panic on the way to a refusal leaves the mark unset.
func policyDenial(ctx context.Context, r admission.Response) admission.Response {
	if m, ok := ctx.Value(policyMarkKey{}).(*policyMark); ok {
		m.denied = true
	}
	return r
}

// withHTTPStatus makes every refusal that is not one of the guard's policy decisions an HTTP
// error: a malformed request gets HTTP 400 (or 413), and anything else (a panic that
// controller-runtime recovered into an answer with code 500, any future bug) HTTP 500. The API
// server then applies the webhook's failurePolicy instead of reading a refusal: an
// AdmissionReview with allowed: false in an HTTP 200 is a denial whatever that policy says.
// Admissions and the guard's own refusals pass through unchanged.
func withHTTPStatus(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mark := &policyMark{}
		r = r.WithContext(context.WithValue(r.Context(), policyMarkKey{}, mark))
		rec := &bufferedWriter{header: w.Header()}
		h.ServeHTTP(rec, r)
		status := http.StatusOK
		// Admissions are the common case: parse only refusals.
		if bytes.Contains(rec.body.Bytes(), []byte(`"allowed":false`)) {
			var review admissionv1.AdmissionReview
			switch err := json.Unmarshal(rec.body.Bytes(), &review); {
			case err != nil || review.Response == nil:
				status = http.StatusInternalServerError
			case review.Response.Allowed:
			case mark.denied && review.Response.Result != nil && review.Response.Result.Code == http.StatusForbidden:
				// The guard's own policy refusal.
			case review.Response.Result != nil && review.Response.Result.Code >= 400 && review.Response.Result.Code < 600 &&
				review.Response.Result.Code != http.StatusForbidden:
				status = int(review.Response.Result.Code)
			default:
				status = http.StatusInternalServerError
			}
		}
		w.WriteHeader(status)
		_, _ = w.Write(rec.body.Bytes())
	})
}

type bufferedWriter struct {
	header http.Header
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header         { return b.header }
func (b *bufferedWriter) Write(p []byte) (int, error) { return b.body.Write(p) }
func (b *bufferedWriter) WriteHeader(int)             {}
