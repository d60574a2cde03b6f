package webhook

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// BenchmarkServe measures the guard's HTTP handler in-process, without TLS or a network: what
// one admission of a 10 KB pod as Argo v3.4.17 makes it costs the guard from the request body
// to the answer (decoding, decision, audit, encoding), next to a handler that admits
// everything on controller-runtime's decoding. Run with:
// go test -run '^$' -bench Serve -benchmem ./webhook (docs/evidence/performance.md).
func BenchmarkServe(b *testing.B) {
	read := func(name string) []byte {
		raw, err := os.ReadFile(filepath.Join("testdata", "argo-pods", name)) //nolint:gosec // G304: the repository's own test data
		if err != nil {
			b.Fatal(err)
		}
		return reviewOf(admissionv1.Create, raw)
	}
	exit, step := read("v3.4.17-exit-handler.json"), read("v3.4.17-step.json")
	g := fuzzGuard(b, Options{StoreFirst: true})
	g.store.Progress("1")
	// The policy as it was before step pods were covered by default.
	skip := fuzzGuard(b, Options{StoreFirst: true, Cover: Coverage{NoSteps: true}})
	skip.store.Progress("1")
	allowAll := &admission.Webhook{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	})}
	for _, tc := range []struct {
		name string
		h    http.Handler
		body []byte
	}{
		{"do-nothing-controller-runtime", allowAll, exit},
		{"exit-handler-store-first", g.path(ValidatePath, readPodReview), exit},
		{"step-pod-store-first", g.path(ValidatePath, readPodReview), step},
		{"pod-not-covered", skip.path(ValidatePath, readPodReview), step},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			for b.Loop() {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(tc.body))
				req.Header.Set("Content-Type", "application/json")
				tc.h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte(`"allowed":true`)) {
					b.Fatalf("HTTP %d: %s", rec.Code, rec.Body.Bytes())
				}
			}
		})
	}
}
