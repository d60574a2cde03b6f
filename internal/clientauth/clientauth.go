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
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"strconv"
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

	// probe is the certificate the readiness check presents: made at start, its key never
	// leaves the process, and it is accepted by its exact bytes.
	probe tls.Certificate

	refused       *prometheus.CounterVec
	reloadFailure prometheus.Counter
}

// Metrics are the counters of refused handshakes and failed reloads. They are registered
// whether or not the mode is on, at 0, so that the chart's alert and dashboard read a series.
type Metrics struct {
	refused       *prometheus.CounterVec
	reloadFailure prometheus.Counter
}

// NewMetrics makes the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exit_guard_webhook_clients_refused_total",
			Help: "TLS handshakes on the webhook port refused for want of a client certificate signed by the --webhook-client-ca-file CA, by reason (no-certificate, untrusted)."}, []string{"reason"}),
		reloadFailure: prometheus.NewCounter(prometheus.CounterOpts{Name: "exit_guard_webhook_client_ca_reload_failures_total",
			Help: "Changes of the --webhook-client-ca-file that could not be read as PEM certificates; the CA read before stays in use."}),
	}
	for _, r := range []string{ReasonNoCertificate, ReasonUntrusted} {
		m.refused.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.refused, m.reloadFailure} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// New reads the CA file (it must hold at least one certificate); m counts what it refuses.
func New(path string, m *Metrics, log logr.Logger) (*Verifier, error) {
	v := &Verifier{path: path, log: log, refused: m.refused, reloadFailure: m.reloadFailure}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("the webhook client CA: %w", err)
	}
	pool, err := readPool(path)
	if err != nil {
		return nil, err
	}
	v.pool, v.modTime, v.size = pool, info.ModTime(), info.Size()
	if v.probe, err = probeCertificate(); err != nil {
		return nil, err
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
	if bytes.Equal(cs.PeerCertificates[0].Raw, v.probe.Certificate[0]) {
		return nil
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

// probeCertificate makes the readiness check's client certificate.
func probeCertificate() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "exit-guard readiness probe"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(100 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// Checker is the readiness check of a webhook port that asks for client certificates, in
// place of controller-runtime's StartedChecker (whose handshake presents none, and would be
// counted as refused at every probe): a TLS handshake with the probe certificate, which must
// be accepted.
//
// Its result is kept for a second: the readiness gauge of the metrics calls it at every scrape.
func (v *Verifier) Checker(port int) func(*http.Request) error {
	cfg := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{v.probe}, MinVersion: tls.VersionTLS12} //nolint:gosec // G402: a handshake with itself, to see it serve
	var (
		mu      sync.Mutex
		checked time.Time
		last    error
	)
	check := func() error {
		d := &net.Dialer{Timeout: 2 * time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", net.JoinHostPort("", strconv.Itoa(port)), cfg)
		if err != nil {
			return fmt.Errorf("webhook server is not reachable: %w", err)
		}
		defer func() { _ = conn.Close() }()
		// With TLS 1.3 the server judges the client certificate after the client's side of
		// the handshake: a refusal arrives on the first read, within milliseconds on loopback.
		_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := conn.Read(make([]byte, 1)); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			return fmt.Errorf("webhook server refused the readiness probe's certificate: %w", err)
		}
		return nil
	}
	return func(*http.Request) error {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(checked) > time.Second {
			last, checked = check(), time.Now()
		}
		return last
	}
}
