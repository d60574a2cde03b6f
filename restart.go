package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
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

// The environment that carries the restart state across an exec.
const (
	envRestarts = "EXIT_GUARD_RESTARTS"
	envBackoff  = "EXIT_GUARD_RESTART_BACKOFF"
)

// maxRestartBackoff bounds the wait between two restarts: each restart lists every Workflow
// again, which a lasting failure must not do every few seconds.
const maxRestartBackoff = time.Minute

// restart is how many times the guard restarted in its process, and the wait before the next.
type restart struct {
	count   int
	backoff time.Duration
}

func restartFromEnv() restart {
	r := restart{backoff: time.Second}
	if n, err := strconv.Atoi(os.Getenv(envRestarts)); err == nil && n > 0 {
		r.count = n
	}
	if d, err := time.ParseDuration(os.Getenv(envBackoff)); err == nil && d > 0 {
		r.backoff = min(d, maxRestartBackoff)
	}
	return r
}

// next is the state of the next restart after a run that lasted ran: the backoff doubles up
// to maxRestartBackoff, and starts again at a second after a run that lasted a minute.
func (r restart) next(ran time.Duration) restart {
	if ran > time.Minute {
		r.backoff = time.Second
	}
	return restart{count: r.count + 1, backoff: r.backoff}
}

// exec replaces the process with a fresh one of the same binary, arguments and environment,
// carrying the restart state; it returns only on failure.
func (r restart) exec() error {
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envRestarts+"=") && !strings.HasPrefix(kv, envBackoff+"=") {
			env = append(env, kv)
		}
	}
	env = append(env,
		envRestarts+"="+strconv.Itoa(r.count),
		envBackoff+"="+min(2*r.backoff, maxRestartBackoff).String())
	return syscall.Exec(bin, os.Args, env) //nolint:gosec // G204: this very binary, its own arguments
}

// waitForFiles closes ready once every file exists, checking every second until ctx ends.
func waitForFiles(ctx context.Context, ready chan<- struct{}, log logr.Logger, files ...string) {
	logged := false
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		missing := ""
		for _, f := range files {
			if _, err := os.Stat(f); err != nil { //nolint:gosec // G703: the certificate files the flags name
				missing = f
				break
			}
		}
		if missing == "" {
			close(ready)
			return
		}
		if !logged {
			log.Info("waiting for the webhook certificate; until it is there the API server cannot reach the guard and admits pods unchecked", "missing", missing)
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
