package main

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

// TestReadinessSaysWhyInTheLog: the kubelet reads only "reason withheld"; the log has each
// failing check's reason once, again when it changes, and the moment all pass.
func TestReadinessSaysWhyInTheLog(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{})
	p := newProbes()
	p.log = log
	certErr := errors.New("no certificate in /tmp/k8s-webhook-server/serving-certs yet")
	synced := errors.New("workflow watch not synced")
	p.set(map[string]healthz.Checker{
		"certificate": func(*http.Request) error { return certErr },
		"workflows":   func(*http.Request) error { return synced },
	})
	probe := func() float64 { return p.readyValue() }
	for range 3 {
		if probe() != 0 {
			t.Fatal("ready with both checks failing")
		}
	}
	certErr = errors.New("certificate not valid yet")
	probe()
	certErr, synced = nil, nil
	if probe() != 1 {
		t.Fatal("not ready with both checks passing")
	}
	probe()
	got := strings.Join(lines, "\n")
	for _, want := range []string{
		`"msg"="not ready" "check"="certificate" "reason"="no certificate in /tmp/k8s-webhook-server/serving-certs yet"`,
		`"msg"="not ready" "check"="workflows" "reason"="workflow watch not synced"`,
		`"msg"="not ready" "check"="certificate" "reason"="certificate not valid yet"`,
		`"msg"="ready check passing" "check"="certificate"`,
		`"msg"="ready check passing" "check"="workflows"`,
		`"msg"="ready" "checks"=2`,
	} {
		if strings.Count(got, want) != 1 {
			t.Errorf("the log has %q %d times, want once:\n%s", want, strings.Count(got, want), got)
		}
	}
	if n := len(lines); n != 6 {
		t.Errorf("%d lines, want 6 (one per change):\n%s", n, got)
	}
}
