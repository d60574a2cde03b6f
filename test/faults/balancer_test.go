//go:build envtest

package faults

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// balancer stands in for a Service in front of the guard's replicas: the API server calls the
// webhook at its address, and it passes each new TCP connection to one of the replicas that
// are in rotation, in turn, and leaves established connections where they are (kube-proxy's
// conntrack does the same). Its endpoints loop probes each replica's /readyz and takes it into
// or out of rotation a propagation delay after its readiness changed, as the endpoints
// controller and kube-proxy do. A connection that finds no replica in rotation, or whose
// replica refuses it, is closed: the API server sees a failed call.
type balancer struct {
	ln          net.Listener
	propagation time.Duration

	mu       sync.Mutex
	backends []*backend
	next     int
	// refused counts connections that found no replica to take them.
	refused atomic.Int64
}

type backend struct {
	name       string
	addr       string // the webhook's host:port
	probeAddr  string
	inRotation bool
	// changeAt is when the pending rotation change takes effect; zero when none is pending.
	changeAt time.Time
}

func startBalancer(addr string, propagation time.Duration) (*balancer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	b := &balancer{ln: ln, propagation: propagation}
	go b.serve()
	return b, nil
}

func (b *balancer) Close() error { return b.ln.Close() }

// newService starts a balancer where the API server calls the webhook, with its endpoints
// loop, until the test ends.
func newService(t *testing.T) *balancer {
	t.Helper()
	b, err := startBalancer(hostPort(), propagation)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go b.endpoints(ctx)
	t.Cleanup(func() {
		cancel()
		_ = b.Close()
	})
	return b
}

// add puts a replica behind the balancer, out of rotation until it is seen ready.
func (b *balancer) add(name, addr, probeAddr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backends = append(b.backends, &backend{name: name, addr: addr, probeAddr: probeAddr})
}

// inRotation says whether the named replica receives new connections.
func (b *balancer) inRotation(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, be := range b.backends {
		if be.name == name {
			return be.inRotation
		}
	}
	return false
}

func (b *balancer) pick() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range b.backends {
		be := b.backends[b.next%len(b.backends)]
		b.next++
		if be.inRotation {
			return be.addr
		}
	}
	return ""
}

func (b *balancer) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer func() { _ = c.Close() }()
			addr := b.pick()
			if addr == "" {
				b.refused.Add(1)
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				b.refused.Add(1)
				return
			}
			defer func() { _ = up.Close() }()
			testenv.Splice(c, up)
		}()
	}
}

// endpoints runs the readiness loop until ctx ends.
func (b *balancer) endpoints(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.mu.Lock()
		probes := make(map[*backend]string, len(b.backends))
		for _, be := range b.backends {
			probes[be] = be.probeAddr
		}
		b.mu.Unlock()
		ready := map[*backend]bool{}
		for be, addr := range probes {
			ready[be] = probeReady(ctx, addr)
		}
		now := time.Now()
		b.mu.Lock()
		for be, r := range ready {
			switch {
			case r == be.inRotation:
				be.changeAt = time.Time{}
			case be.changeAt.IsZero():
				be.changeAt = now.Add(b.propagation)
			case now.After(be.changeAt):
				be.inRotation, be.changeAt = r, time.Time{}
			}
		}
		b.mu.Unlock()
	}
}

func probeReady(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
