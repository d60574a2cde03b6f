//go:build envtest

package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/internal/fixture"
)

// relay is a TCP relay on loopback in front of the test API server: TLS and HTTP/2 pass
// through it untouched. blackhole makes every connection it relays at that moment stop
// relaying, both ways, without closing: what is sent is dropped, as a killed API-server
// instance, a load balancer or a conntrack drop leaves an established connection. Connections
// accepted later relay again.
type relay struct {
	ln       net.Listener
	target   string
	accepted atomic.Int32

	mu    sync.Mutex
	conns []*atomic.Bool // each relayed connection's "dead" flag
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target}
	var wg sync.WaitGroup
	var open sync.Map
	t.Cleanup(func() {
		_ = ln.Close()
		open.Range(func(c, _ any) bool { _ = c.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			r.accepted.Add(1)
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			open.Store(in, true)
			open.Store(out, true)
			dead := &atomic.Bool{}
			r.mu.Lock()
			r.conns = append(r.conns, dead)
			r.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				defer func() { _ = dst.Close(); _ = src.Close() }()
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if n > 0 && !dead.Load() {
						if _, werr := dst.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}
			wg.Go(func() { pipe(out, in) })
			wg.Go(func() { pipe(in, out) })
		}
	})
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

// blackhole drops, from now on, everything sent on the connections relayed so far.
func (r *relay) blackhole() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, dead := range r.conns {
		dead.Store(true)
	}
}

// The live read survives a blackholed established connection: its hedge dials a connection
// of its own, and the pool's dead HTTP/2 connection is given up after an unanswered ping. The
// manager's client, whose hedges would share its one HTTP/2 connection and whose health check
// waits 45 s, is the control: the blackhole must defeat it, else this test proves nothing.
func TestHedgeGetsPastABlackholedConnection(t *testing.T) {
	ns := newNamespace(t)
	scheme := testScheme(t)
	wf := createWorkflow(t, ns, "succeeded", argo.PhaseSucceeded)
	pod := fixture.ExitPod(wf)

	readPath := func(cfg *rest.Config) client.Reader {
		p, err := newReadPath(cfg, scheme)
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
		{name: "the read path", reader: readPath, decisions: 12},
		{name: "control: the manager's client", reader: managers, decisions: 3, control: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startRelay(t, hostPort(t, env.Config.Host))
			cfg := rest.CopyConfig(env.Config)
			cfg.Host = "https://" + r.addr()
			reader := c.reader(cfg)
			g, err := newGuard(reader, storeFor(t, wf, storeSucceeded, false),
				Options{LiveReadTimeout: 300 * time.Millisecond, LiveReadBudget: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			// HTTP/2 end to end, on one connection, before the fault.
			var proto string
			ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
				if tc, ok := info.Conn.(*tls.Conn); ok {
					proto = tc.ConnectionState().NegotiatedProtocol
				}
			}})
			if d := g.decide(ctx, podFacts(t, pod)); d.source != sourceLive || !d.deny {
				t.Fatalf("before the fault: decision %+v, want a refusal from a live read", d)
			}
			if proto != "h2" {
				t.Fatalf("the live read negotiated %q, want h2: the fault below is about an HTTP/2 connection", proto)
			}
			before := r.accepted.Load()
			r.blackhole()
			live := 0
			for range c.decisions {
				d := g.decide(t.Context(), podFacts(t, pod))
				if d.source == sourceLive && d.deny && d.reason == ReasonWorkflowCompleted {
					live++
				}
			}
			t.Logf("%s: %d of %d decisions after the blackhole made from a live read; %d connections dialled after it",
				c.name, live, c.decisions, r.accepted.Load()-before)
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
func TestReadPathDoesNotRetryOnItsOwn(t *testing.T) {
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
			p, err := newReadPath(&rest.Config{Host: srv.URL}, testScheme(t))
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
				t.Errorf("the server was sent %d requests for one List and one Get, want 2: the read path retried on its own", n)
			}
		})
	}
}
