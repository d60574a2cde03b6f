//go:build envtest

package testenv

import (
	"net"
	"net/url"
	"strconv"
	"testing"
)

// The ports tests bind again later (the webhook port each guard binds, the API server's on a
// restart) lie below the kernel's ephemeral range, where no outgoing connection can hold them in
// between, and test binaries of other packages cannot be handed them while this one lives.
func TestPortsBoundAgainAreOutsideTheEphemeralRange(t *testing.T) {
	low, high := fixedPortRange()
	if low >= high {
		t.Fatalf("no range below the ephemeral ports on this machine ([%d, %d)): FreeAddr falls back to the kernel's", low, high)
	}
	in := func(what string, port int) {
		t.Helper()
		if port < low || port >= high {
			t.Errorf("%s %d is outside [%d, %d)", what, port, low, high)
		}
	}
	seen := map[string]bool{}
	for range 50 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("FreeAddr handed out %s twice", addr)
		}
		seen[addr] = true
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			t.Fatal(err)
		}
		in("FreeAddr's port", p)
		// Another process (here another open file, which flock tells apart alike) cannot
		// reserve it.
		if held, err := reserve(p); err != nil || held {
			t.Fatalf("port %d, handed out, could be reserved again: %v, %v", p, held, err)
		}
	}
	in("the webhook's port", env.WebhookPort)
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("the API server's address %q: %v", env.Config.Host, err)
	}
	in("the API server's port", p)
}
