package main

import (
	"bytes"
	"crypto/tls"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// handshakes counts the TLS handshakes clients start on the webhook port (a ClientHello read),
// and, from what Go's HTTP servers log (stdlibLog), the handshakes that failed, by reason.
// With the API server's own fail-open count, they say from the guard's side alone why the API
// server fails open: nothing started (it does not reach the guard: endpoints, network
// policies, a firewall), started and failed (TLS: bad-certificate or unknown-authority is a
// caBundle that does not match the guard's certificate), neither (the guard answered: its
// latency, against timeoutSeconds).
type handshakes struct {
	started prometheus.Counter
	failed  *prometheus.CounterVec
}

func newHandshakes(reg prometheus.Registerer) (*handshakes, error) {
	h := &handshakes{
		started: prometheus.NewCounter(prometheus.CounterOpts{Name: "exit_guard_webhook_tls_handshakes_started_total",
			Help: "TLS handshakes a client started on the webhook port (its ClientHello read)."}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exit_guard_tls_handshake_errors_total",
			Help: "TLS handshakes that failed on the guard's servers (the webhook port, and the metrics port with --metrics-secure), by reason: bad-certificate and unknown-authority (the client does not trust the guard's certificate: on the webhook port, the API server with a caBundle that does not match it), eof (the client hung up), timeout, other."},
			[]string{"reason"}),
	}
	for _, c := range []prometheus.Collector{h.started, h.failed} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"bad-certificate", "unknown-authority", "eof", "timeout", "other"} {
		h.failed.WithLabelValues(r) // present at 0, so that increase() sees the first one
	}
	return h, nil
}

// Configure counts the handshakes clients start on c.
func (h *handshakes) Configure(c *tls.Config) {
	next := c.GetConfigForClient
	c.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		h.started.Inc()
		if next != nil {
			return next(hello)
		}
		return nil, nil
	}
}

// handshakeReason is the reason label of a failed handshake's error text.
func handshakeReason(err string) string {
	switch {
	case strings.Contains(err, "bad certificate"):
		return "bad-certificate"
	case strings.Contains(err, "unknown certificate authority"):
		return "unknown-authority"
	case err == "EOF" || strings.HasSuffix(err, ": EOF"):
		return "eof"
	case strings.Contains(err, "timeout"):
		return "timeout"
	default:
		return "other"
	}
}

// stdlibLog is the output of Go's standard logger, where net/http writes what its servers
// (the webhook's, the metrics') cannot hand to anyone else: failed TLS handshakes above all.
// Each line becomes a structured log line of the guard's; a failed handshake is logged at most
// once in every 10 seconds, with how many there were since the last line, so that a client
// cannot flood the log.
type stdlibLog struct {
	log    logr.Logger
	failed *prometheus.CounterVec // nil: not counted

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

const handshakePrefix = "http: TLS handshake error from "

// Write implements io.Writer for log.SetOutput.
func (s *stdlibLog) Write(p []byte) (int, error) {
	for _, line := range strings.Split(string(bytes.TrimRight(p, "\n")), "\n") {
		// The standard logger's date and time prefix, when its flags add one.
		if i := strings.Index(line, "http: "); i > 0 {
			line = line[i:]
		}
		rest, ok := strings.CutPrefix(line, handshakePrefix)
		if !ok {
			s.log.Info(line)
			continue
		}
		from, reason, _ := strings.Cut(rest, ": ")
		if s.failed != nil {
			s.failed.WithLabelValues(handshakeReason(reason)).Inc()
		}
		s.mu.Lock()
		now := time.Now()
		if !s.last.IsZero() && now.Sub(s.last) < 10*time.Second {
			s.suppressed++
			s.mu.Unlock()
			continue
		}
		suppressed := s.suppressed
		s.last, s.suppressed = now, 0
		s.mu.Unlock()
		s.log.Info("TLS handshake failed", "from", from, "reason", reason, "class", handshakeReason(reason), "moreSinceLastLine", suppressed,
			"meaning", "on the webhook port from the API server, most often a caBundle that does not match the guard's certificate (remote error: tls: bad certificate, unknown certificate authority): the API server then fails open")
	}
	return len(p), nil
}
