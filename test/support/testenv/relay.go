package testenv

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Relay is a TCP relay on loopback in front of a test API server: TLS and HTTP/2 pass
// through it untouched. Blackhole makes every connection it relays at that moment stop
// relaying, both ways, without closing: what is sent is dropped, as a killed API-server
// instance, a load balancer or a conntrack drop leaves an established connection. Connections
// accepted later relay again.
type Relay struct {
	ln       net.Listener
	target   string
	accepted atomic.Int32

	mu    sync.Mutex
	conns []*atomic.Bool // each relayed connection's "dead" flag
}

// StartRelay starts a relay to target (host:port) that lasts until the test ends.
func StartRelay(t testing.TB, target string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{ln: ln, target: target}
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

// Addr is the relay's host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Accepted is how many connections the relay has accepted.
func (r *Relay) Accepted() int32 { return r.accepted.Load() }

// Blackhole drops, from now on, everything sent on the connections relayed so far.
func (r *Relay) Blackhole() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, dead := range r.conns {
		dead.Store(true)
	}
}

// Splice copies between a and b, both ways, until either side ends.
func Splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(a, b); done <- struct{}{} }()
	go func() { _, _ = io.Copy(b, a); done <- struct{}{} }()
	<-done
}
