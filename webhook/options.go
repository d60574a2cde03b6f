package webhook

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// Mode says what the guard does with a pod it would refuse.
type Mode string

// Modes.
const (
	// ModeEnforce denies the pod.
	ModeEnforce Mode = "enforce"
	// ModeWarn admits it with an admission warning, an Event on the workflow and the audit
	// of a denial, and marks it.
	ModeWarn Mode = "warn"
	// ModeDryRun admits it quietly (no warning, no Event), logs and counts it, and marks it.
	ModeDryRun Mode = "dry-run"
)

// ParseMode parses a mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeEnforce, ModeWarn, ModeDryRun:
		return m, nil
	}
	return "", fmt.Errorf("unknown mode %q: want enforce, warn or dry-run", s)
}

// StoreFallback says what the store alone may refuse when no live read answers in time.
type StoreFallback string

// Store fallbacks.
const (
	// FallbackTombstone refuses only for a workflow the store saw deleted: a deleted UID never
	// comes back, so this refusal is always right. A completion that only the store holds
	// admits the pod, with reason unconfirmed-completion: it may be a stale copy, or a retry
	// the guard's watch has not delivered yet, and the guard cannot tell them apart.
	FallbackTombstone StoreFallback = "tombstone"
	// FallbackFresh also refuses for a completion (in a deny phase) that only the store holds,
	// an object that a retry sends only after re-running nodes (an exit-handler pod, a
	// WorkflowFailed Event, a TaskSet write that adds only the workflow-level exit handler's
	// task), while the store is close behind the API server: the newest write it is known to
	// have received (its latest lag sample: a changed workflow's managed-fields time) is
	// younger than StoreFreshFor. Changes arrive in order, so a retry the store lacks was
	// written less than StoreFreshFor ago; Argo retries a Succeeded workflow only with
	// --restart-successful, re-running nodes (pods: seconds) before its exit handler.
	// Otherwise (the store further behind, or an agent, step or hook pod, which a retry sends
	// at once) the object is admitted as unconfirmed-completion. A retry can still be refused
	// when its re-run nodes finish within StoreFreshFor while the guard cannot see it:
	// docs/evidence/reliability.md measures how often.
	FallbackFresh StoreFallback = "fresh"
	// FallbackCompletion refuses for a completion that only the store holds however long ago
	// the watch advanced: more stale pods stopped while the API server cannot answer, at the
	// price of refusing the exit handler of a workflow retried in that moment.
	FallbackCompletion StoreFallback = "completion"
	// FallbackRequeue refuses, for a completion that only the store holds however long ago
	// the watch advanced, the pods Argo's controller creates again on its next pass when one
	// is refused (exit-handler pods, and hook and step pods where the policy covers them):
	// a refusal is a 429, which every controller line takes as transient (the node waits,
	// Pending, and the workflow is requeued), so a wrong one costs a retried workflow's exit
	// handler a requeue per pass until the guard can see the retry, never its notice, and
	// the guard notices it (overturned.go). What a refusal would lose (an agent pod, which
	// v3.4 turns into a workflow Error; a TaskSet write, which waits for something to wake
	// the workflow; an Event, which client-go drops) is judged as with FallbackFresh.
	FallbackRequeue StoreFallback = "requeue"
)

// ParseStoreFallback parses a store fallback name.
func ParseStoreFallback(s string) (StoreFallback, error) {
	switch f := StoreFallback(s); f {
	case FallbackTombstone, FallbackFresh, FallbackCompletion, FallbackRequeue:
		return f, nil
	}
	return "", fmt.Errorf("unknown store fallback %q: want requeue, fresh, tombstone or completion", s)
}

const (
	// defaultLiveReadTimeout is how long one attempt of the live read may take before
	// another is started beside it (a hedge): a consistent read answers in milliseconds when
	// the API server is well.
	defaultLiveReadTimeout = time.Second
	// defaultLiveReadBudget is how long the live read may take in all, attempts and retries
	// included. The chart's webhook timeoutSeconds is 5 s: a second is kept for the store
	// fallback, the answer and the network, so that the API server never sees the webhook
	// time out.
	defaultLiveReadBudget = 4 * time.Second
	// defaultEventReadTimeout and defaultEventReadBudget bound the live read of an Event's
	// workflow. Short: each namespace's recorder in Argo's controller sends its Events one at a
	// time, so every millisecond an Event waits here delays every later Event of that namespace
	// (and its queue of 1,000 drops when full). The chart's Event webhook timeoutSeconds is 2 s.
	defaultEventReadTimeout = 250 * time.Millisecond
	defaultEventReadBudget  = time.Second
	// defaultGetBesideListAfter is how long the LIST of a live read may go unanswered before
	// a GET of the workflow starts beside it. The LIST is answered from the API server's watch
	// cache once that cache has caught up with etcd, a wait that makes the read's tail; the GET
	// goes to etcd at once. 25 ms is past the LIST's p99 on an idle API server (8.5 to 17 ms,
	// docs/evidence/performance.md table 6), so that about one read in a hundred costs a second request.
	defaultGetBesideListAfter = 25 * time.Millisecond
	// defaultTaskSetRepeatsFor: row T7's window (docs/decisions.md).
	defaultTaskSetRepeatsFor = 5 * time.Second
	// defaultStoreFallback: see docs/evidence/reliability.md for the figures behind it.
	defaultStoreFallback = FallbackRequeue
	// defaultStoreFreshFor: with fresh, and with requeue for what Argo does not send again, a
	// store completion refuses only while the store's newest write is younger than 5 s.
	// docs/evidence/reliability.md has the figures.
	defaultStoreFreshFor = 5 * time.Second
)

// Options configures the guard.
type Options struct {
	// Mode is enforce (default), warn or dry-run.
	Mode Mode
	// DenyPhases are the terminal phases whose exit handlers are refused (default Succeeded).
	// Adding Failed and Error stops the duplicate notices a stale copy of a failed workflow
	// sends.
	DenyPhases []argo.Phase
	// Hooks also covers the pods of lifecycle hooks other than exit (`.hooks.` nodes).
	Hooks bool
	// Strict covers every pod a workflow owns, not only exit handlers: a stale copy can also
	// re-create ordinary step pods (argo-workflows #16294).
	Strict bool
	// StoreFirst decides exit-handler pods from the store when it holds no completion for the
	// workflow, with no live read; the live read then only confirms a denial. Lower latency,
	// but a guard whose own watch lags admits a stale pod it would have refused.
	StoreFirst bool
	// LiveReadTimeout bounds one attempt of the live read of the owning workflow (default
	// 1 s); past it another attempt starts beside it.
	LiveReadTimeout time.Duration
	// LiveReadBudget bounds the live read in all, retries included (default 4 s); past it
	// the store decides, as StoreFallback says.
	LiveReadBudget time.Duration
	// GetBesideListAfter is how long the LIST of a live read may go unanswered before a GET of
	// the workflow starts beside it, the first answer winning (default 25 ms; negative: never).
	GetBesideListAfter time.Duration
	// TaskSetRepeatsFor is how long after a TaskSet create admitted on a live read the same
	// create is admitted without one (row T7; default 5 s, at most createMemory; negative:
	// every create is read).
	TaskSetRepeatsFor time.Duration
	// EventReadTimeout and EventReadBudget are LiveReadTimeout and LiveReadBudget for the
	// workflow of an Event (default 250 ms and 1 s).
	EventReadTimeout time.Duration
	EventReadBudget  time.Duration
	// StoreFallback is what the store alone may refuse when no live read answered within the
	// budget (default FallbackRequeue).
	StoreFallback StoreFallback
	// StoreFreshFor is how recently the watch must have advanced for FallbackFresh to refuse
	// from a completion only the store holds: how young its newest write must be (default 5 s).
	StoreFreshFor time.Duration
	// Namespaces limits the guard to these namespaces (all when empty); pods elsewhere are
	// admitted at once.
	Namespaces []string
	// MaxConcurrentDecisions bounds the decisions in flight (default 128): one past it reads
	// nothing live and the store decides, counted as a live-read failure of kind shed.
	MaxConcurrentDecisions int
	// ExpectedRequester is the user that sends what the guard judges: Argo's workflow
	// controller, as system:serviceaccount:<namespace>:<name>. A refusal of a request from
	// anyone else is still a refusal, but counted apart
	// (exit_guard_unexpected_requester_decisions_total, not exit_guard_decisions_total), logged
	// with the requester, and its Event is Normal with a reason of its own. Empty: every
	// requester is expected.
	ExpectedRequester string
	// Registerer receives the guard's metrics (default controller-runtime's registry).
	Registerer prometheus.Registerer
	// EventSource is the reportingController of the guard's Events (default "exit-guard").
	EventSource string
}

func (o *Options) complete() error {
	var errs []error
	if o.Mode == "" {
		o.Mode = ModeEnforce
	}
	if _, err := ParseMode(string(o.Mode)); err != nil {
		errs = append(errs, err)
	}
	if len(o.DenyPhases) == 0 {
		o.DenyPhases = []argo.Phase{argo.PhaseSucceeded}
	}
	for _, p := range o.DenyPhases {
		if !p.Terminal() {
			errs = append(errs, fmt.Errorf("deny phase %q is not a terminal phase (Succeeded, Failed, Error)", p))
		}
	}
	if o.LiveReadTimeout < 0 {
		errs = append(errs, fmt.Errorf("live read timeout must not be negative, got %s", o.LiveReadTimeout))
	}
	if o.LiveReadTimeout == 0 {
		o.LiveReadTimeout = defaultLiveReadTimeout
	}
	if o.LiveReadBudget < 0 {
		errs = append(errs, fmt.Errorf("live read budget must not be negative, got %s", o.LiveReadBudget))
	}
	if o.LiveReadBudget == 0 {
		o.LiveReadBudget = max(defaultLiveReadBudget, o.LiveReadTimeout)
	}
	if o.LiveReadTimeout > o.LiveReadBudget {
		errs = append(errs, fmt.Errorf("live read timeout %s is longer than the live read budget %s", o.LiveReadTimeout, o.LiveReadBudget))
	}
	if o.GetBesideListAfter == 0 {
		o.GetBesideListAfter = defaultGetBesideListAfter
	}
	if o.TaskSetRepeatsFor == 0 {
		o.TaskSetRepeatsFor = defaultTaskSetRepeatsFor
	}
	if o.TaskSetRepeatsFor > createMemory {
		errs = append(errs, fmt.Errorf("TaskSet repeats window %s is longer than %s, the memory of admitted creates", o.TaskSetRepeatsFor, createMemory))
	}
	if o.EventReadTimeout < 0 || o.EventReadBudget < 0 {
		errs = append(errs, fmt.Errorf("event read timeout and budget must not be negative, got %s and %s", o.EventReadTimeout, o.EventReadBudget))
	}
	if o.EventReadTimeout == 0 {
		o.EventReadTimeout = defaultEventReadTimeout
	}
	if o.EventReadBudget == 0 {
		o.EventReadBudget = max(defaultEventReadBudget, o.EventReadTimeout)
	}
	if o.EventReadTimeout > o.EventReadBudget {
		errs = append(errs, fmt.Errorf("event read timeout %s is longer than the event read budget %s", o.EventReadTimeout, o.EventReadBudget))
	}
	if o.StoreFallback == "" {
		o.StoreFallback = defaultStoreFallback
	}
	if _, err := ParseStoreFallback(string(o.StoreFallback)); err != nil {
		errs = append(errs, err)
	}
	if o.StoreFreshFor < 0 {
		errs = append(errs, fmt.Errorf("store fresh-for must not be negative, got %s", o.StoreFreshFor))
	}
	if o.StoreFreshFor == 0 {
		o.StoreFreshFor = defaultStoreFreshFor
	}
	for _, ns := range o.Namespaces {
		if strings.TrimSpace(ns) == "" {
			errs = append(errs, errors.New("an empty namespace name in the watched namespaces"))
		}
	}
	if o.MaxConcurrentDecisions < 0 {
		errs = append(errs, fmt.Errorf("max concurrent decisions must not be negative, got %d", o.MaxConcurrentDecisions))
	}
	if o.MaxConcurrentDecisions == 0 {
		o.MaxConcurrentDecisions = defaultMaxConcurrentDecisions
	}
	if o.EventSource == "" {
		o.EventSource = "exit-guard"
	}
	return errors.Join(errs...)
}

// ParsePhases parses a comma-separated list of terminal phases.
func ParsePhases(s string) ([]argo.Phase, error) {
	var out []argo.Phase
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, ok := argo.ParsePhase(f)
		if !ok {
			return nil, fmt.Errorf("unknown phase %q: want Succeeded, Failed or Error", f)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("no phase given: want one or more of Succeeded, Failed, Error")
	}
	return out, nil
}
