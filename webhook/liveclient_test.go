//go:build envtest

package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// The live read survives a blackholed established connection: its hedge dials a connection
// of its own, and the pool's dead HTTP/2 connection is given up after an unanswered ping. The
// manager's client, whose hedges would share its one HTTP/2 connection and whose health check
// waits 45 s, is the control: the blackhole must defeat it, else this test proves nothing.
func TestHedgeGetsPastABlackholedConnection(t *testing.T) {
	ns := newNamespace(t)
	scheme := testScheme(t)
	wf := createWorkflow(t, ns, "succeeded", argo.PhaseSucceeded)
	pod := fixture.ExitPod(wf)

	liveClient := func(cfg *rest.Config) client.Reader {
		p, err := newLiveClient(cfg, scheme)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	managers := func(cfg *rest.Config) client.Reader {
		c, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, c := range []struct {
		name      string
		reader    func(*rest.Config) client.Reader
		decisions int
		control   bool
	}{
		{name: "the live client", reader: liveClient, decisions: 12},
		{name: "control: the manager's client", reader: managers, decisions: 3, control: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := testenv.StartRelay(t, hostPort(t, env.Config.Host))
			cfg := rest.CopyConfig(env.Config)
			cfg.Host = "https://" + r.Addr()
			reader := c.reader(cfg)
			g, err := newGuard(reader, storeFor(t, wf, storeSucceeded, false),
				Options{LiveReadTimeout: 300 * time.Millisecond, LiveReadBudget: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			// HTTP/2 end to end, on one connection, before the fault.
			// The LIST and a GET beside it (or a hedge) get their connections on goroutines of
			// their own, which may outlive the decision.
			var proto atomic.Value
			ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
				if tc, ok := info.Conn.(*tls.Conn); ok {
					proto.Store(tc.ConnectionState().NegotiatedProtocol)
				}
			}})
			if d := g.decide(ctx, podFacts(t, pod)); d.source != sourceLive || !d.deny {
				t.Fatalf("before the fault: decision %+v, want a refusal from a live read", d)
			}
			if proto, _ := proto.Load().(string); proto != "h2" {
				t.Fatalf("the live read negotiated %q, want h2: the fault below is about an HTTP/2 connection", proto)
			}
			before := r.Accepted()
			r.Blackhole()
			live := 0
			for range c.decisions {
				d := g.decide(t.Context(), podFacts(t, pod))
				if d.source == sourceLive && d.deny && d.reason == contract.ReasonWorkflowCompleted {
					live++
				}
			}
			t.Logf("%s: %d of %d decisions after the blackhole made from a live read; %d connections dialled after it",
				c.name, live, c.decisions, r.Accepted()-before)
			switch {
			case c.control && live > 0:
				t.Fatalf("the blackhole did not stop the manager's client (%d of %d live): this test proves nothing", live, c.decisions)
			case !c.control && live != c.decisions:
				t.Errorf("%d of %d decisions after the blackhole were made from a live read, want all", live, c.decisions)
			}
		})
	}
}

// hostPort is the host:port of an API server URL.
func hostPort(t *testing.T, host string) string {
	t.Helper()
	u, err := http.NewRequest(http.MethodGet, host, nil)
	if err != nil {
		t.Fatal(err)
	}
	return u.URL.Host
}

// A 429 or 5xx with Retry-After fails the attempt at once: client-go would wait the
// Retry-After (a second at least) and retry inside the attempt, hidden from the live read's
// own pauses and hedges. The server counts what it was sent.
func TestLiveClientDoesNotRetryOnItsOwn(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			var requests atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Retry-After", "1")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":` +
					map[int]string{429: "429", 503: "503"}[status] + `}`))
			}))
			t.Cleanup(srv.Close)
			p, err := newLiveClient(&rest.Config{Host: srv.URL}, testScheme(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			list := &metav1.PartialObjectMetadataList{}
			err = p.List(ctx, list, client.InNamespace("ns"), client.MatchingFields{"metadata.name": "wf"})
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("List = %v, want the server's answer as an error", err)
			}
			if status == http.StatusTooManyRequests && !apierrors.IsTooManyRequests(err) {
				t.Errorf("List = %v, want a 429", err)
			}
			if err := p.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "wf"}, &argo.Workflow{}); err == nil {
				t.Fatal("Get succeeded against a server that answers every request with an error")
			}
			if n := requests.Load(); n != 2 {
				t.Errorf("the server was sent %d requests for one List and one Get, want 2: the live client retried on its own", n)
			}
		})
	}
}

// TestLiveClientTakesUpARotatedCA: the API server's serving certificate is replaced by one of a
// new CA, and the CA file of the guard's rest config (in a cluster, the ServiceAccount's
// projected ca.crt) is rewritten with it. The pool's first read after the rotation fails its
// verification; the next is made on a pool built anew from the file, and answers. Here a TLS
// front on loopback plays the API server's endpoint (it passes every request on to the test
// API server), so that its certificate can change.
func TestLiveClientTakesUpARotatedCA(t *testing.T) {
	wf := createWorkflow(t, newNamespace(t), "rotated", argo.PhaseSucceeded)
	upstream, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	upstreamRT, err := rest.TransportFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(upstream)
	proxy.Transport = upstreamRT
	var serving atomic.Pointer[tls.Certificate]
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	rotate := func() {
		certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		serving.Store(&pair)
		if err := os.WriteFile(caFile, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rotate()
	front := httptest.NewUnstartedServer(proxy)
	front.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{Certificates: []tls.Certificate{*serving.Load()}}, nil
	}}
	front.StartTLS()
	t.Cleanup(front.Close)

	p, err := newLiveClient(&rest.Config{Host: front.URL, TLSClientConfig: rest.TLSClientConfig{CAFile: caFile}}, testScheme(t))
	if err != nil {
		t.Fatal(err)
	}
	read := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		return p.Get(ctx, client.ObjectKeyFromObject(wf), &argo.Workflow{})
	}
	if err := read(); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	rotate()
	front.CloseClientConnections() // the next read needs a new handshake
	err = read()
	var unknownCA x509.UnknownAuthorityError
	if !errors.As(err, &unknownCA) {
		t.Fatalf("the first read after the rotation: %v; want it to fail verification against the old CA (the test proves nothing otherwise)", err)
	}
	if err := read(); err != nil {
		t.Errorf("the read after a failed verification, with the rotated CA in the file: %v; want an answer from a pool built anew", err)
	}
}

// The sweep's check of a run unseen between two completions (checkRerun) reads a workflow's
// status.startedAt, which `argo retry` sets anew: the live client's GET of a real workflow
// decodes it.
func TestTheLiveClientReadsWhenAWorkflowRunStarted(t *testing.T) {
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "retried", argo.PhaseSucceeded)
	started := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	if err := unstructured.SetNestedField(wf.Object, started.Format(time.RFC3339), "status", "startedAt"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Update(t.Context(), wf); err != nil {
		t.Fatal(err)
	}
	p, err := newLiveClient(env.Config, testScheme(t))
	if err != nil {
		t.Fatal(err)
	}
	g := &guard{reader: p}
	got, err := g.getWorkflow(t.Context(), ns, wf.GetName())
	if err != nil {
		t.Fatal(err)
	}
	if !got.Status.StartedAt.Time.Equal(started) || got.UID != wf.GetUID() || got.Status.Phase != argo.PhaseSucceeded {
		t.Errorf("read uid %s, phase %s, started %s; want %s, %s, %s", got.UID, got.Status.Phase, got.Status.StartedAt, wf.GetUID(), argo.PhaseSucceeded, started)
	}
}
