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
// runs. The kubelet and exit_guard_ready see only pass or fail ("reason withheld"), so each
// check's reason is logged when it changes: a check that starts failing, or fails for another
// reason, logs "not ready" with the check and its reason; one that passes again logs "ready
// check passing"; all of them passing, "ready".
type probes struct {
	mu     sync.Mutex
	checks map[string]healthz.Checker
	log    logr.Logger
	// last is each check's last result ("" when it passed), ready whether all passed.
	last  map[string]string
	ready bool
}

func newProbes() *probes { return &probes{} }

// set makes checks the readiness checks; nil means no run is going on.
func (p *probes) set(checks map[string]healthz.Checker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checks = checks
	p.last, p.ready = nil, false
}

// notRunning is the one check between runs.
var notRunning = map[string]healthz.Checker{"running": func(*http.Request) error {
	return errors.New("the guard is not running: starting, or restarting after a failure")
}}

// current is the readiness checks, each logging its result when it changes.
func (p *probes) current() map[string]healthz.Checker {
	p.mu.Lock()
	checks := p.checks
	p.mu.Unlock()
	if checks == nil {
		checks = notRunning
	}
	out := make(map[string]healthz.Checker, len(checks))
	for name, check := range checks {
		out[name] = func(r *http.Request) error {
			err := check(r)
			p.note(name, err, len(checks))
			return err
		}
	}
	return out
}

// note logs a check's result when it differs from the last one, and "ready" when all n checks
// pass for the first time since they last did not.
func (p *probes) note(name string, err error, n int) {
	reason := ""
	if err != nil {
		reason = err.Error()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil {
		p.last = map[string]string{}
	}
	prev, seen := p.last[name]
	p.last[name] = reason
	switch {
	case reason != "" && (!seen || prev != reason):
		p.ready = false
		p.log.Info("not ready", "check", name, "reason", reason)
	case reason == "" && seen && prev != "":
		p.log.Info("ready check passing", "check", name)
	}
	if reason != "" || p.ready || len(p.last) < n {
		return
	}
	for _, r := range p.last {
		if r != "" {
			return
		}
	}
	p.ready = true
	p.log.Info("ready", "checks", n)
}

// readyValue is 1 while every readiness check passes, else 0.
func (p *probes) readyValue() float64 {
	req, err := http.NewRequest(http.MethodGet, "/readyz", nil)
	if err != nil {
		return 0
	}
	ready := 1.0
	for _, check := range p.current() { // every check, so that each one's reason is logged
		if check(req) != nil {
			ready = 0
		}
	}
	return ready
}

// serve serves the probes on addr ("0" disables them) until the process ends.
func (p *probes) serve(addr string, log logr.Logger) error {
	p.mu.Lock()
	p.log = log
	p.mu.Unlock()
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
