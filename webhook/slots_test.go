package webhook

import (
	"context"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// exitPodRequest is the admission request of tableWorkflow's exit-handler pod, sent for user.
func exitPodRequest(user string) admissionv1.AdmissionRequest {
	return admissionv1.AdmissionRequest{
		UID: "u", Operation: admissionv1.Create, Resource: podResource, Namespace: tableWorkflow.GetNamespace(),
		Object:   runtime.RawExtension{Raw: fixture.JSON(fixture.ExitPod(tableWorkflow))},
		UserInfo: authenticationv1.UserInfo{Username: user},
	}
}

// holdFirstReads makes g's live reads answer Succeeded, the first n of them only once release
// is closed, each saying on started that it waits; reads counts the reads made.
func holdFirstReads(g *guard, n int) (started, release chan struct{}, reads func() int) {
	var mu sync.Mutex
	made := 0
	started, release = make(chan struct{}), make(chan struct{})
	g.readLive = func(_ context.Context, namespace, name string, _ readPolicy) (*argo.Workflow, error) {
		mu.Lock()
		made++
		held := made <= n
		mu.Unlock()
		if held {
			started <- struct{}{}
			<-release
		}
		return cannedRead(liveSucceeded, new(int))(context.Background(), namespace, name, readPolicy{})
	}
	return started, release, func() int {
		mu.Lock()
		defer mu.Unlock()
		return made
	}
}

// TestDecisionsPastTheCapAreShed: with MaxConcurrentDecisions decisions waiting on their live
// reads, the next one reads nothing: the store decides it at once (here it knows nothing, so
// unverified-fail-open), counted as a live-read failure of kind shed. Once a slot is free, a
// decision reads live again.
func TestDecisionsPastTheCapAreShed(t *testing.T) {
	g, err := newGuard(nil, storeFor(t, tableWorkflow, storeEmpty, false), Options{MaxConcurrentDecisions: 2})
	if err != nil {
		t.Fatal(err)
	}
	started, release, reads := holdFirstReads(g, 2) // the two decisions that hold the slots wait
	h := g.path(ValidatePath, readPodReview)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if r := answerOf(t, h, exitPodRequest("")); r.Allowed {
				t.Errorf("a decision within the cap was admitted (%s); its live read says Succeeded", r.Result.Message)
			}
		})
		<-started
	}
	r := answerOf(t, h, exitPodRequest(""))
	if !r.Allowed || r.Result.Message != string(contract.ReasonUnverifiedFailOpen) {
		t.Errorf("the decision past the cap: allowed %v (%s), want admitted as %s", r.Allowed, r.Result.Message, contract.ReasonUnverifiedFailOpen)
	}
	if got := value(t, g.metrics.liveReadFailures.WithLabelValues("shed")); got != 1 {
		t.Errorf("live-read failures of kind shed = %v, want 1", got)
	}
	if n := reads(); n != 2 {
		t.Errorf("%d live reads, want 2: the shed decision must read nothing", n)
	}
	close(release)
	wg.Wait()
	if r := answerOf(t, h, exitPodRequest("")); r.Allowed {
		t.Errorf("with the slots free again, the decision was admitted (%s); its live read says Succeeded", r.Result.Message)
	}
}

// TestRefusalsForAnUnexpectedRequesterAreCountedApart: a refusal sent for the expected
// controller counts in exit_guard_decisions_total; one sent for anyone else is still refused
// but counts only in exit_guard_unexpected_requester_decisions_total, and says so in its audit
// annotations. Admissions are the same for both.
func TestRefusalsForAnUnexpectedRequesterAreCountedApart(t *testing.T) {
	const controller = "system:serviceaccount:argo:argo-workflow-controller"
	g, err := newGuard(nil, storeFor(t, tableWorkflow, storeEmpty, false), Options{ExpectedRequester: controller})
	if err != nil {
		t.Fatal(err)
	}
	g.readLive = cannedRead(liveSucceeded, new(int))
	h := g.path(ValidatePath, readPodReview)
	for _, c := range []struct {
		user                  string
		decisions, unexpected float64
		annotation            string
	}{
		{controller, 1, 0, ""},
		{"system:serviceaccount:default:someone", 1, 1, "unexpected"},
		{"", 1, 2, "unexpected"},
	} {
		r := answerOf(t, h, exitPodRequest(c.user))
		if r.Allowed {
			t.Errorf("%q: admitted; a refusal stays a refusal whoever sends it", c.user)
		}
		if got := decided(t, g, verdictDenied, contract.ReasonWorkflowCompleted, kindPod); got != c.decisions {
			t.Errorf("%q: exit_guard_decisions_total = %v, want %v", c.user, got, c.decisions)
		}
		if got := value(t, g.metrics.unexpected.WithLabelValues(verdictDenied, string(contract.ReasonWorkflowCompleted), string(kindPod))); got != c.unexpected {
			t.Errorf("%q: exit_guard_unexpected_requester_decisions_total = %v, want %v", c.user, got, c.unexpected)
		}
		if got := r.AuditAnnotations["requester"]; got != c.annotation {
			t.Errorf("%q: audit annotation requester = %q, want %q", c.user, got, c.annotation)
		}
	}
	// A dry run (exit-guard check, helm test) persists nothing: counted apart, whoever sends it,
	// so that the install check raises neither the unexpected-requester alert nor the
	// stale-exit-handler one.
	req := exitPodRequest("system:serviceaccount:argo:exit-guard-check")
	req.DryRun = ptr.To(true)
	if r := answerOf(t, h, req); r.Allowed {
		t.Error("a dry run was admitted")
	}
	if got := value(t, g.metrics.unexpected.WithLabelValues(verdictDenied, string(contract.ReasonWorkflowCompleted), string(kindPod))); got != 2 {
		t.Errorf("after a dry run for another user, exit_guard_unexpected_requester_decisions_total = %v, want 2 still", got)
	}
	if got := decided(t, g, verdictDenied, contract.ReasonWorkflowCompleted, kindPod); got != 1 {
		t.Errorf("after a dry run for another user, exit_guard_decisions_total = %v, want 1 still", got)
	}
	if got := value(t, g.metrics.dryRuns.WithLabelValues(verdictDenied, string(contract.ReasonWorkflowCompleted), string(kindPod))); got != 1 {
		t.Errorf("after a dry run for another user, exit_guard_dry_run_decisions_total = %v, want 1", got)
	}
}

// value is a counter's value.
func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestUnexpectedRequestersHaveSlotsOfTheirOwn: requests for someone other than the expected
// controller decide in a pool of an eighth of the cap; when it is full they are shed, and the
// controller's own decisions still read live.
func TestUnexpectedRequestersHaveSlotsOfTheirOwn(t *testing.T) {
	const controller = "system:serviceaccount:argo:argo-workflow-controller"
	g, err := newGuard(nil, storeFor(t, tableWorkflow, storeEmpty, false), Options{MaxConcurrentDecisions: 8, ExpectedRequester: controller})
	if err != nil {
		t.Fatal(err)
	}
	started, release, reads := holdFirstReads(g, 1) // the first unexpected decision holds its pool's only slot
	h := g.path(ValidatePath, readPodReview)
	var wg sync.WaitGroup
	wg.Go(func() { answerOf(t, h, exitPodRequest("someone")) })
	<-started
	if r := answerOf(t, h, exitPodRequest("someone-else")); !r.Allowed || r.Result.Message != string(contract.ReasonUnverifiedFailOpen) {
		t.Errorf("a second unexpected requester's decision: allowed %v (%s), want shed and admitted as %s", r.Allowed, r.Result.Message, contract.ReasonUnverifiedFailOpen)
	}
	if r := answerOf(t, h, exitPodRequest(controller)); r.Allowed {
		t.Errorf("the controller's decision was admitted (%s): with the other pool full it must still read live, and the read says Succeeded", r.Result.Message)
	}
	close(release)
	wg.Wait()
	if n := reads(); n != 2 {
		t.Errorf("%d live reads, want 2 (the held unexpected one and the controller's)", n)
	}
}

// decided is exit_guard_decisions_total for verdict, reason and kind, whatever its source.
func decided(t *testing.T, g *guard, verdict string, reason contract.Reason, kind objectKind) float64 {
	t.Helper()
	var sum float64
	for _, src := range decisionSources {
		sum += value(t, g.metrics.decisions.WithLabelValues(verdict, string(reason), string(kind), src))
	}
	return sum
}
