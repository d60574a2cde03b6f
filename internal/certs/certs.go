// Package certs lets exit-guard manage its own webhook serving certificate: a CA and a serving
// certificate kept in a Secret, the CA written into the guard's webhook configurations, and
// both renewed before they expire. The work is done by open-policy-agent/cert-controller's
// rotator, a well-kept library used by Gatekeeper; this package only configures it and holds
// the webhook server back until the certificate is on disk.
//
// The Secret is mounted into the guard's pod at the certificate folder; the kubelet refreshes
// the files when the rotator updates the Secret, and controller-runtime's certificate watcher
// serves the new certificate without a restart.
package certs

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// The rotator keeps the CA and certificate in a Secret of the guard's namespace and writes the
// CA into the guard's webhook configurations. The chart grants these by resource name: the
// guard's own Secret and webhook configuration (see narrowed).
// +kubebuilder:rbac:groups="",namespace=exit-guard,resources=secrets,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations;mutatingwebhookconfigurations,verbs=get;list;watch;update

// The files of the certificate the rotator writes into CertDir (cert-controller's names), and
// the webhook server reads.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// DefaultOptions are the defaults of self-managed certificates, the only place they are written
// (the command line binds its flags into a copy of them): the Secret's name (its namespace is
// the pod's), a serving certificate valid a year, renewed 90 days before it expires, checked
// twice a day.
func DefaultOptions() Options {
	return Options{
		Secret:             types.NamespacedName{Name: "exit-guard-webhook-tls"},
		ServerCertDuration: 365 * 24 * time.Hour,
		Lookahead:          90 * 24 * time.Hour,
		CheckFrequency:     12 * time.Hour,
	}
}

// Options configures self-managed certificates.
type Options struct {
	// Secret holds ca.crt, ca.key, tls.crt and tls.key.
	Secret types.NamespacedName
	// CertDir is where the Secret is mounted; the webhook server reads tls.crt and tls.key there.
	CertDir string
	// DNSName is the Service's name the API server calls, <service>.<namespace>.svc.
	DNSName string
	// ExtraDNSNames are further names the serving certificate is valid for.
	ExtraDNSNames []string
	// ValidatingWebhooks and MutatingWebhooks name the webhook configurations whose caBundle
	// the guard writes. Name only those that exist.
	ValidatingWebhooks []string
	MutatingWebhooks   []string
	// ServerCertDuration is how long a serving certificate is valid.
	ServerCertDuration time.Duration
	// Lookahead is how long before expiry a certificate is renewed.
	Lookahead time.Duration
	// CheckFrequency is how often expiry is checked.
	CheckFrequency time.Duration
}

// Setup adds the rotator to mgr. It closes ready once the certificate is mounted and the CA is
// in every named webhook configuration, and returns a readiness check that passes from then
// on. The webhook server given to the manager should be WaitFor(server, ready).
func Setup(mgr manager.Manager, opts Options, ready chan struct{}) (healthz.Checker, error) {
	if opts.Secret.Namespace == "" || opts.Secret.Name == "" {
		return nil, errors.New("certs: the certificate Secret needs a namespace and a name")
	}
	if opts.DNSName == "" {
		return nil, errors.New("certs: the webhook Service's DNS name is required")
	}
	// No webhook configuration at all is the chart's kill switch (webhook.enabled=false): the
	// guard keeps its certificate, ready for when they come back, and writes no caBundle.
	if len(opts.ValidatingWebhooks) > 1 || len(opts.MutatingWebhooks) > 1 {
		// One name per kind: the rotator's lists select their object by name (narrowed).
		return nil, errors.New("certs: name at most one validating and one mutating webhook configuration")
	}
	var hooks []rotator.WebhookInfo
	for _, n := range opts.ValidatingWebhooks {
		hooks = append(hooks, rotator.WebhookInfo{Name: n, Type: rotator.Validating})
	}
	for _, n := range opts.MutatingWebhooks {
		hooks = append(hooks, rotator.WebhookInfo{Name: n, Type: rotator.Mutating})
	}
	err := rotator.AddRotator(narrowed(mgr, opts), &rotator.CertRotator{
		SecretKey:              opts.Secret,
		CertDir:                opts.CertDir,
		CAName:                 "exit-guard-ca",
		CAOrganization:         "exit-guard",
		DNSName:                opts.DNSName,
		ExtraDNSNames:          opts.ExtraDNSNames,
		IsReady:                ready,
		Webhooks:               hooks,
		FieldOwner:             "exit-guard",
		ServerCertDuration:     opts.ServerCertDuration,
		LookaheadInterval:      opts.Lookahead,
		RotationCheckFrequency: opts.CheckFrequency,
		// Every replica serves webhooks and needs the certificate; writes of the same Secret
		// by two replicas are ordered by resourceVersion conflicts.
		RequireLeaderElection: false,
	})
	if err != nil {
		return nil, fmt.Errorf("certs: adding the certificate rotator: %w", err)
	}
	return func(*http.Request) error {
		select {
		case <-ready:
			return nil
		default:
			return errors.New("the webhook certificate is not mounted or its CA is not in the webhook configurations yet")
		}
	}, nil
}

// narrowed is mgr as the rotator sees it: its cache lists and watches only the guard's own
// Secret and webhook configurations. cert-controller builds that cache from the manager's
// config with no selector, which would need list and watch on every Secret of the namespace
// (in the argo namespace, Argo's own credentials) and every webhook configuration of the
// cluster. With a metadata.name field selector on each list and watch, the API server
// authorizes them by resource name, so the chart's RBAC names the guard's objects alone.
func narrowed(mgr manager.Manager, opts Options) manager.Manager {
	// Paths are matched at their end: an API server reached through a proxy may have a prefix.
	names := map[string]string{
		"/api/v1/namespaces/" + opts.Secret.Namespace + "/secrets": opts.Secret.Name,
	}
	if len(opts.ValidatingWebhooks) == 1 {
		names["/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"] = opts.ValidatingWebhooks[0]
	}
	if len(opts.MutatingWebhooks) == 1 {
		names["/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"] = opts.MutatingWebhooks[0]
	}
	cfg := rest.CopyConfig(mgr.GetConfig())
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &nameSelector{next: rt, names: names} })
	return &narrowManager{Manager: mgr, cfg: cfg}
}

type narrowManager struct {
	manager.Manager
	cfg *rest.Config
}

// GetConfig returns the narrowed config.
func (m *narrowManager) GetConfig() *rest.Config { return m.cfg }

// nameSelector adds fieldSelector=metadata.name=<name> to lists and watches of the
// collections it names.
type nameSelector struct {
	next  http.RoundTripper
	names map[string]string // collection path: object name
}

// RoundTrip implements http.RoundTripper.
func (n *nameSelector) RoundTrip(req *http.Request) (*http.Response, error) {
	name, ok := "", false
	for suffix, v := range n.names {
		if strings.HasSuffix(req.URL.Path, suffix) {
			name, ok = v, true
			break
		}
	}
	if !ok || req.Method != http.MethodGet || req.URL.Query().Get("fieldSelector") != "" {
		return n.next.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	q := req.URL.Query()
	q.Set("fieldSelector", fields.OneTermEqualSelector("metadata.name", name).String())
	req.URL.RawQuery = q.Encode()
	return n.next.RoundTrip(req)
}

// WaitFor returns a webhook server that starts serving only once ready is closed: the server
// reads its certificate when it starts, and a self-managed one does not exist before that.
func WaitFor(s webhook.Server, ready <-chan struct{}) webhook.Server {
	return &waitingServer{Server: s, ready: ready}
}

type waitingServer struct {
	webhook.Server
	ready <-chan struct{}
}

// Start waits for the certificate, then serves.
func (w *waitingServer) Start(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-w.ready:
	}
	return w.Server.Start(ctx)
}

// WaitForFiles closes ready once every file exists, checking every second until ctx ends: the
// wait of a webhook server whose certificate comes from outside (cert-manager, the chart, a
// mounted Secret that may be empty at first). Give ready to WaitFor.
func WaitForFiles(ctx context.Context, ready chan<- struct{}, log logr.Logger, files ...string) {
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

// WaitForMounted closes ready once rotated is closed (the rotator's readiness) and every file
// exists. cert-controller's readiness looks for the certificate file alone, and a kubelet
// links the files of a Secret volume one at a time after the Secret changes: a webhook server
// started on the certificate alone may find no key and stop. Give ready to WaitFor.
func WaitForMounted(ctx context.Context, rotated <-chan struct{}, ready chan<- struct{}, log logr.Logger, files ...string) {
	select {
	case <-ctx.Done():
		return
	case <-rotated:
	}
	WaitForFiles(ctx, ready, log, files...)
}

// FileCertificate is a tls.Config GetCertificate that serves the key pair of certFile and
// keyFile, read again when either changes (checked at each handshake, at most once a second):
// the metrics endpoint serves the webhook's certificate, whose CA the chart knows (the Secret's
// ca.crt), so that a scraper can verify it. Until the files exist (a self-managed certificate
// is written after the start) the handshake fails.
func FileCertificate(certFile, keyFile string) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	var (
		mu      sync.Mutex
		checked time.Time
		stamp   string
		current *tls.Certificate
	)
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		if current != nil && time.Since(checked) < time.Second {
			return current, nil
		}
		checked = time.Now()
		var s strings.Builder
		for _, f := range []string{certFile, keyFile} {
			info, err := os.Stat(f) //nolint:gosec // G703: the certificate files the flags name
			if err != nil {
				if current != nil {
					return current, nil
				}
				return nil, fmt.Errorf("the serving certificate is not there yet: %w", err)
			}
			fmt.Fprintf(&s, "%d/%d;", info.ModTime().UnixNano(), info.Size())
		}
		if current != nil && s.String() == stamp {
			return current, nil
		}
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			if current != nil { // half-written: keep the last good one until it settles
				return current, nil
			}
			return nil, err
		}
		current, stamp = &pair, s.String()
		return current, nil
	}
}
