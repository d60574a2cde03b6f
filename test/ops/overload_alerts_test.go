//go:build e2e

package ops

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// fastReads are the guard's live-read timings in these scenarios: a hung read gives up soon, so
// that each admission is answered within a second and a half.
var fastReads = []string{"--live-read-timeout=300ms", "--live-read-budget=1s"}

// TestOverloadAlertsOnTheRealTools: the alerts of a struggling API server, each from its real
// cause, the guard reaching the API server through a proxy that hangs its reads of single
// workflows or holds back its Workflow watch.
func TestOverloadAlertsOnTheRealTools(t *testing.T) {
	var timings []timing
	defer logTimings(t, &timings)

	t.Run("ExitGuardLiveReadsFailing: the API server's reads hang", func(t *testing.T) {
		st := startStack(t)
		p := testenv.StartAPIProxy(t, env.Config)
		st.guardVia(t, p.KubeConfig(t), fastReads...)
		ns := newNamespace(t)
		waitQuery(t, st, `exit_guard_ready{namespace="argo"} == 1`)
		stop := createExitHandlers(t, ns, "hung")
		defer stop()
		cause := time.Now()
		p.HangReads.Store(true)
		n, fired := st.waitNotified(t, "ExitGuardLiveReadsFailing", "firing", cause, 120*time.Second, map[string]string{"pod": "exit-guard-a"})
		if !strings.Contains(n.Annotations["description"], "the guard decides from its store") {
			t.Errorf("description %q", n.Annotations["description"])
		}
		if p.Hung.Load() == 0 {
			t.Fatal("no read reached the proxy's hang: the alert fired for another cause")
		}
		end := time.Now()
		p.HangReads.Store(false)
		_, resolved := st.waitNotified(t, "ExitGuardLiveReadsFailing", "resolved", end, 120*time.Second, nil)
		timings = append(timings, timing{alert: "ExitGuardLiveReadsFailing", fired: fired, resolved: resolved})
	})

	t.Run("ExitGuardDecisionsUnverified and ExitGuardWatchStalled: reads hang and the watch stalls", func(t *testing.T) {
		// Stalled after 60 s without an event or bookmark (the least the chart takes: the API
		// server bookmarks about every minute); workflows are written every second meanwhile.
		st := startStack(t, "prometheusRule.watchStalledAfterSeconds=60")
		p := testenv.StartAPIProxy(t, env.Config)
		st.guardVia(t, p.KubeConfig(t), fastReads...)
		ns := newNamespace(t)
		waitQuery(t, st, `exit_guard_ready{namespace="argo"} == 1`)
		stop := createExitHandlers(t, ns, "unseen")
		defer stop()
		cause := time.Now()
		// The workflows created from here are unknown to the store, and no read answers: each
		// exit handler is admitted unverified.
		p.Stall.Store(true)
		p.HangReads.Store(true)
		n, unverified := st.waitNotified(t, "ExitGuardDecisionsUnverified", "firing", cause, 120*time.Second,
			map[string]string{"kind": "Pod", "reason": "unverified-fail-open", "pod": "exit-guard-a"})
		if !strings.Contains(n.Annotations["description"], "Pod admissions in 20s were let through with no live read (unverified-fail-open)") {
			t.Errorf("description %q", n.Annotations["description"])
		}
		n, stalled := st.waitNotified(t, "ExitGuardWatchStalled", "firing", cause, 120*time.Second, map[string]string{"pod": "exit-guard-a"})
		if !strings.Contains(n.Annotations["summary"], "The Workflow watch of exit-guard exit-guard-a has stopped advancing") {
			t.Errorf("summary %q", n.Annotations["summary"])
		}
		end := time.Now()
		p.Stall.Store(false)
		p.HangReads.Store(false)
		_, watching := st.waitNotified(t, "ExitGuardWatchStalled", "resolved", end, 120*time.Second, nil)
		_, verified := st.waitNotified(t, "ExitGuardDecisionsUnverified", "resolved", end, 120*time.Second, nil)
		timings = append(timings, timing{alert: "ExitGuardDecisionsUnverified", fired: unverified, resolved: verified},
			timing{alert: "ExitGuardWatchStalled", fired: stalled, resolved: watching})
	})

	t.Run("ExitGuardDecisionsShed: more exit handlers at once than decision slots", func(t *testing.T) {
		st := startStack(t)
		p := testenv.StartAPIProxy(t, env.Config)
		// Two slots, and reads that hang for the whole budget: a third admission at once finds
		// every slot taken.
		st.guardVia(t, p.KubeConfig(t), append(append([]string{}, fastReads...), "--max-concurrent-decisions=2")...)
		ns := newNamespace(t)
		waitQuery(t, st, `exit_guard_ready{namespace="argo"} == 1`)
		p.HangReads.Store(true)
		cause := time.Now()
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					running := testenv.CreateWorkflow(t, env.Client, ns, fmt.Sprintf("burst-%d-%d", w, i), argo.PhaseRunning)
					_ = env.Client.Create(ctx, fixture.ExitPod(running))
				}
			})
		}
		n, fired := st.waitNotified(t, "ExitGuardDecisionsShed", "firing", cause, 120*time.Second, map[string]string{"pod": "exit-guard-a"})
		if !strings.Contains(n.Annotations["description"], "decisions in 20s found every slot taken") {
			t.Errorf("description %q", n.Annotations["description"])
		}
		cancel()
		wg.Wait()
		end := time.Now()
		p.HangReads.Store(false)
		_, resolved := st.waitNotified(t, "ExitGuardDecisionsShed", "resolved", end, 120*time.Second, nil)
		timings = append(timings, timing{alert: "ExitGuardDecisionsShed", fired: fired, resolved: resolved})
	})
}
