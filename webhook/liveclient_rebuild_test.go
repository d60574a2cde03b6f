package webhook

import (
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// TestLiveClientPoolIsBuiltAnew: the pool is kept while it is young and nothing failed as a
// rotation makes requests fail; it is built anew once older than liveClientRebuildAfter, and
// after a 401, at most once per liveClientRebuildAtMost. Other failures (a timeout, a 503) keep
// it.
func TestLiveClientPoolIsBuiltAnew(t *testing.T) {
	scheme, err := argo.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	p, err := newLiveClient(&rest.Config{Host: "https://127.0.0.1:1"}, scheme)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	p.clock, p.builtAt = clk, clk.Now()
	first := p.pooled()
	for _, err := range []error{errors.New("timeout"), apierrors.NewServiceUnavailable("busy")} {
		p.noteFailure(err)
		if p.pooled() != first {
			t.Errorf("the pool was built anew after %v", err)
		}
	}
	clk.Step(liveClientRebuildAfter - time.Second)
	if p.pooled() != first {
		t.Error("the pool was built anew before liveClientRebuildAfter")
	}
	clk.Step(time.Second)
	if clk.HasWaiters() {
		t.Fatal("a timer before any rebuild")
	}
	second := p.pooled()
	if second == first {
		t.Error("the pool was kept past liveClientRebuildAfter")
	}
	if !clk.HasWaiters() {
		t.Error("the old pool's busy connections were not scheduled to close after liveClientDrainAfter")
	}
	p.noteFailure(apierrors.NewUnauthorized("expired"))
	if p.pooled() != second {
		t.Error("a 401 rebuilt a pool built less than liveClientRebuildAtMost ago")
	}
	clk.Step(liveClientRebuildAtMost)
	third := p.pooled()
	if third == second {
		t.Error("the pool was kept after a 401")
	}
	for range 3 {
		// A 401 that persists: no new pool per request.
		p.noteFailure(apierrors.NewUnauthorized("revoked"))
		if p.pooled() != third {
			t.Error("a persisting 401 rebuilt the pool within liveClientRebuildAtMost")
		}
	}
	clk.Step(liveClientDrainAfter)
	if clk.HasWaiters() {
		t.Error("the old pools' close did not run liveClientDrainAfter after their rebuild")
	}
}
