package shutdown

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

func TestDrainKeepsServingUnreadyThenStops(t *testing.T) {
	const delay = 300 * time.Millisecond
	d, err := New(delay, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	srv := webhook.NewServer(webhook.Options{})
	d.Server(srv).Register("/validate", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("answered"))
	}))
	call := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		srv.WebhookMux().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/validate", nil))
		return rec
	}
	req := httptest.NewRequest(http.MethodGet, "/readyz", nil)

	signal, stop := context.WithCancel(t.Context())
	ctx := d.Run(signal)
	if err := d.Ready()(req); err != nil {
		t.Errorf("unready before the signal: %v", err)
	}
	if rec := call(); rec.Header().Get("Connection") == "close" || rec.Body.String() != "answered" {
		t.Errorf("before the signal: Connection %q, body %q; want kept alive and answered", rec.Header().Get("Connection"), rec.Body)
	}

	stopped := time.Now()
	stop()
	// The drain starts on its own goroutine.
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return d.Draining(), nil }); err != nil {
		t.Fatal("the drain never started")
	}
	if err := d.Ready()(req); err == nil {
		t.Error("still ready after the signal")
	}
	if rec := call(); rec.Header().Get("Connection") != "close" || rec.Body.String() != "answered" {
		t.Errorf("while draining: Connection %q, body %q; want closed and answered", rec.Header().Get("Connection"), rec.Body)
	}
	if ctx.Err() != nil {
		t.Error("the manager's context ended at the signal, not after the delay")
	}
	<-ctx.Done()
	if waited := time.Since(stopped); waited < delay {
		t.Errorf("the manager's context ended %s after the signal, before the %s delay", waited, delay)
	}
}

func TestNegativeDelayIsRefused(t *testing.T) {
	if _, err := New(-time.Second, logr.Discard()); err == nil {
		t.Error("New accepted a negative delay")
	}
}
