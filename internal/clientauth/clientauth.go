// Package clientauth makes the webhook answer only the API server: a TLS client must present a
// certificate, for client authentication, signed by a CA read from a file. That file is read
// again when it changes (checked at each handshake), so that a rotated CA takes effect without
// a restart; an unreadable new version keeps the last good one, and says so.
//
// Every refused handshake is counted (exit_guard_webhook_clients_refused_total, by reason):
// with failurePolicy Ignore an API server whose client certificate the guard refuses admits
// everything unchecked, and only this counter (and the API server's fail-open count) says so.
package clientauth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a handshake is refused.
const (
	ReasonNoCertificate = "no-certificate"
	ReasonUntrusted     = "untrusted"
)

// Verifier checks client certificates against the CA of a file.
type Verifier struct {
	path string
	log  logr.Logger

	mu      sync.Mutex
	logged  time.Time
	modTime time.Time
	size    int64
	pool    *x509.CertPool

	refused       *prometheus.CounterVec
	reloadFailure prometheus.Counter
}

// New reads the CA file (it must hold at least one certificate) and registers the metrics.
func New(path string, reg prometheus.Registerer, log logr.Logger) (*Verifier, error) {
	v := &Verifier{path: path, log: log,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "exit_guard_webhook_clients_refused_total",
			Help: "TLS handshakes on the webhook port refused for want of a client certificate signed by the --webhook-client-ca-file CA, by reason (no-certificate, untrusted).",
		}, []string{"reason"}),
		reloadFailure: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "exit_guard_webhook_client_ca_reload_failures_total",
			Help: "Changes of the --webhook-client-ca-file that could not be read as PEM certificates; the CA read before stays in use.",
		}),
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("the webhook client CA: %w", err)
	}
	pool, err := readPool(path)
	if err != nil {
		return nil, err
	}
	v.pool, v.modTime, v.size = pool, info.ModTime(), info.Size()
	for _, r := range []string{ReasonNoCertificate, ReasonUntrusted} {
		v.refused.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{v.refused, v.reloadFailure} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// readPool reads a PEM file of CA certificates.
func readPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path) //nolint:gosec // G304: the operator's own flag
	if err != nil {
		return nil, fmt.Errorf("the webhook client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the webhook client CA %s holds no PEM certificate", path)
	}
	return pool, nil
}

// current returns the CA pool, read again first if the file changed.
func (v *Verifier) current() *x509.CertPool {
	v.mu.Lock()
	defer v.mu.Unlock()
	info, err := os.Stat(v.path)
	if err != nil || info.ModTime().Equal(v.modTime) && info.Size() == v.size {
		return v.pool
	}
	pool, err := readPool(v.path)
	if err != nil {
		v.reloadFailure.Inc()
		v.log.Error(err, "the webhook client CA changed and cannot be read; keeping the one read before", "file", v.path)
	} else {
		v.pool = pool
		v.log.Info("webhook client CA read again", "file", v.path)
	}
	// A broken version is not read again at every handshake: only once it changes again.
	v.modTime, v.size = info.ModTime(), info.Size()
	return v.pool
}

// Configure makes a server's TLS config ask for a client certificate and accept only those
// the CA signed for client authentication.
func (v *Verifier) Configure(c *tls.Config) {
	c.ClientAuth = tls.RequestClientCert
	c.VerifyConnection = v.verify
}

func (v *Verifier) verify(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		v.refused.WithLabelValues(ReasonNoCertificate).Inc()
		v.logRefusal("", errors.New("no client certificate"))
		return errors.New("exit-guard answers only the API server: no client certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots: v.current(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		v.refused.WithLabelValues(ReasonUntrusted).Inc()
		v.logRefusal(cs.PeerCertificates[0].Subject.String(), err)
		return fmt.Errorf("exit-guard answers only the API server: %w", err)
	}
	return nil
}

// logRefusal logs a refused handshake, at most once in 10 seconds: a client must not be able to
// flood the log (the counter counts them all).
func (v *Verifier) logRefusal(subject string, err error) {
	v.mu.Lock()
	now := time.Now()
	quiet := now.Sub(v.logged) < 10*time.Second
	if !quiet {
		v.logged = now
	}
	v.mu.Unlock()
	if !quiet {
		v.log.Info("webhook client refused: not a certificate of the client CA (exit_guard_webhook_clients_refused_total counts them all)",
			"subject", subject, "error", err.Error(), "file", v.path)
	}
}
