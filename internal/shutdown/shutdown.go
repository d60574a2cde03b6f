// Package shutdown drains exit-guard's webhook before it stops. A pod that is told to stop is
// taken out of its Service's endpoints only a moment later (the endpoints controller, then
// every kube-proxy); a webhook that closes its listener at SIGTERM refuses the connections the
// API server still opens to it meanwhile, and the API server applies the failure policy to
// each: a fail-open window on every rollout. So on the signal the guard turns unready, keeps
// serving for a delay while the endpoints catch up, answers with "Connection: close" so that
// the API server's kept-alive connections move to the other replicas, and only then stops
// (finishing the requests in flight).
package shutdown

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Drainer turns a stop signal into a drain, then a stop.
type Drainer struct {
	delay    time.Duration
	draining atomic.Bool
	log      logr.Logger
}

// New returns a Drainer that keeps serving for delay after the signal.
func New(delay time.Duration, log logr.Logger) (*Drainer, error) {
	if delay < 0 {
		return nil, errors.New("shutdown: the delay must not be negative")
	}
	return &Drainer{delay: delay, log: log}, nil
}

// Run returns the context to run the manager with: it ends delay after signal does. From the
// signal on, Ready fails and the webhook's answers close their connections.
func (d *Drainer) Run(signal context.Context) context.Context {
	ctx, cancel := context.WithCancel(context.WithoutCancel(signal))
	go func() {
		<-signal.Done()
		d.draining.Store(true)
		d.log.Info("draining: unready, still serving until the endpoints have caught up", "delay", d.delay)
		t := time.NewTimer(d.delay)
		defer t.Stop()
		<-t.C
		d.log.Info("drained: stopping")
		cancel()
	}()
	return ctx
}

// Draining says whether the signal has come.
func (d *Drainer) Draining() bool { return d.draining.Load() }

// Ready is a readiness check that fails from the signal on.
func (d *Drainer) Ready() healthz.Checker {
	return func(*http.Request) error {
		if d.Draining() {
			return errors.New("shutting down")
		}
		return nil
	}
}

// Server wraps a webhook server so that every handler registered on it answers with
// "Connection: close" while draining.
func (d *Drainer) Server(s webhook.Server) webhook.Server {
	return &drainingServer{Server: s, d: d}
}

type drainingServer struct {
	webhook.Server
	d *Drainer
}

// Register registers h, wrapped.
func (s *drainingServer) Register(path string, h http.Handler) {
	s.Server.Register(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.d.Draining() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	}))
}
