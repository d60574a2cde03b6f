package main

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// probes serves /healthz and /readyz for the life of the process. /healthz passes while the
// process runs; /readyz runs the checks of the current run of the guard, and fails between
// runs.
type probes struct {
	mu     sync.Mutex
	checks map[string]healthz.Checker
}

func newProbes() *probes { return &probes{} }

// set makes checks the readiness checks; nil means no run is going on.
func (p *probes) set(checks map[string]healthz.Checker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checks = checks
}

func (p *probes) current() map[string]healthz.Checker {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.checks == nil {
		return map[string]healthz.Checker{"running": func(*http.Request) error {
			return errors.New("the guard is not running: starting, or restarting after a failure")
		}}
	}
	return p.checks
}

// readyValue is 1 while every readiness check passes, else 0.
func (p *probes) readyValue() float64 {
	req, err := http.NewRequest(http.MethodGet, "/readyz", nil)
	if err != nil {
		return 0
	}
	for _, check := range p.current() {
		if check(req) != nil {
			return 0
		}
	}
	return 1
}

// serve serves the probes on addr ("0" disables them) until the process ends.
func (p *probes) serve(addr string, log logr.Logger) error {
	if addr == "0" || addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	ready := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(&healthz.Handler{Checks: p.current()}).ServeHTTP(w, r)
	})
	live := &healthz.Handler{Checks: map[string]healthz.Checker{"ping": healthz.Ping}}
	mux := http.NewServeMux()
	mux.Handle("/readyz", http.StripPrefix("/readyz", ready))
	mux.Handle("/readyz/", http.StripPrefix("/readyz", ready))
	mux.Handle("/healthz", http.StripPrefix("/healthz", live))
	mux.Handle("/healthz/", http.StripPrefix("/healthz", live))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "the health probes stopped")
		}
	}()
	// Served until the process ends, not until the signal: while the webhook drains after
	// SIGTERM, /readyz must say "shutting down".
	log.Info("serving the health probes", "address", ln.Addr().String())
	return nil
}

// registerReady registers exit_guard_ready, which follows the readiness of p.
func registerReady(p *probes) error {
	return metrics.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "exit_guard_ready",
		Help: "1 while every readiness check of the guard passes (the webhook serves, the Workflow watch has synced, not shutting down), else 0.",
	}, p.readyValue))
}
