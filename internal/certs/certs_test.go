package certs

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// TestWaitForMountedWaitsForTheKey: the rotator says ready once the certificate file exists,
// and a kubelet may link the key a moment later; the webhook server must not start before.
func TestWaitForMountedWaitsForTheKey(t *testing.T) {
	dir := t.TempDir()
	crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	rotated, ready := make(chan struct{}), make(chan struct{})
	go WaitForMounted(t.Context(), rotated, ready, logr.Discard(), crt, key)

	if err := os.WriteFile(crt, []byte("certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	close(rotated)
	// WaitForFiles checks at once, then every second: 1.5 s covers the first check and the
	// next one, which would both have closed ready on the certificate alone.
	select {
	case <-ready:
		t.Fatal("ready with the certificate but no key")
	case <-time.After(1500 * time.Millisecond):
	}
	if err := os.WriteFile(key, []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("not ready 30 s after the key appeared")
	}
}

// TestWaitForMountedWaitsForTheRotator: files left from an earlier run are not enough while
// the rotator has not said its certificate is in place.
func TestWaitForMountedWaitsForTheRotator(t *testing.T) {
	dir := t.TempDir()
	crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for _, f := range []string{crt, key} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rotated, ready := make(chan struct{}), make(chan struct{})
	go WaitForMounted(t.Context(), rotated, ready, logr.Discard(), crt, key)
	select {
	case <-ready:
		t.Fatal("ready before the rotator")
	case <-time.After(200 * time.Millisecond):
	}
	close(rotated)
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("not ready 30 s after the rotator")
	}
}
