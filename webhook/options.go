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

// MaxTaskSetRepeatsFor is the longest Options.TaskSetRepeatsFor: the memory of admitted
// TaskSet creates.
const MaxTaskSetRepeatsFor = createMemory

// DefaultOptions are the guard's defaults: the only place they are written. The command line
// binds its flags into a copy of them (docs/flags.md is generated from it), complete fills an
// Options' zero fields from them, and `make verify` checks the chart's values against them.
func DefaultOptions() Options {
	return Options{
		Mode:       ModeEnforce,
		DenyPhases: Phases{argo.PhaseSucceeded},
		// One attempt of the live read, before another starts beside it (a hedge): a
		// consistent read answers in milliseconds when the API server is well.
		LiveReadTimeout: time.Second,
		// The live read in all, attempts and retries included. The chart's webhook
		// timeoutSeconds is 5 s: a second is kept for the store fallback, the answer and the
		// network, so that the API server never sees the webhook time out.
		LiveReadBudget: 4 * time.Second,
		// A step or hook pod waits at most a second on the guard, whatever the API server does:
		// Argo's controller creates a pass's pods one after another, and a pass has 30 s in all
		// (MAX_OPERATION_TIME). 750 ms leaves a quarter of that second for the store's answer,
		// the audit and the network (docs/decisions.md, "What a pod costs").
		HookStepReadBudget: 750 * time.Millisecond,
		// 25 ms is past the LIST's p99 on an idle API server (8.5 to 17 ms,
		// docs/evidence/performance.md table 6), so that about one read in a hundred costs a
		// second request. The LIST is answered from the API server's watch cache once that
		// cache has caught up with etcd, a wait that makes the read's tail; the GET goes to
		// etcd at once.
		GetBesideListAfter: 25 * time.Millisecond,
		// Row T7's window (docs/decisions.md).
		TaskSetRepeatsFor: 5 * time.Second,
		// Short: each namespace's recorder in Argo's controller sends its Events one at a
		// time, so every millisecond an Event waits here delays every later Event of that
		// namespace (and its queue of 1,000 drops when full). The chart's Event webhook
		// timeoutSeconds is 2 s.
		EventReadTimeout: 250 * time.Millisecond,
		EventReadBudget:  time.Second,
		// docs/evidence/reliability.md has the figures behind both.
		StoreFallback: FallbackRequeue,
		StoreFreshFor: 5 * time.Second,
		// Twelve of Argo's requeues (DEFAULT_REQUEUE_TIME, 10 s): longer than the stale
		// refusals measured last (seconds: docs/evidence/argo-e2e.md), and as long as a
		// retried workflow's exit handler may wait on a guard cut off from the API server.
		StoreRefusalsFor: 2 * time.Minute,
		// Argo's controller sends pods and TaskSet writes from its workflow workers
		// (--workflow-workers, 32 by default), each one request at a time, and its Events one
		// at a time per namespace: 128 leaves room for a controller with four times the
		// default workers, or Events of many namespaces at once, before anything is shed.
		MaxConcurrentDecisions: 128,
		EventSource:            "exit-guard",
	}
}

// Options configures the guard. Zero fields take DefaultOptions'.
type Options struct {
	// Mode is enforce, warn or dry-run.
	Mode Mode
	// DenyPhases are the terminal phases whose exit handlers are refused.
	// Adding Failed and Error stops the duplicate notices a stale copy of a failed workflow
	// sends.
	DenyPhases Phases
	// Cover says which pods of a workflow the guard judges beyond its exit-handler and agent
	// pods, which it always judges. The zero value covers every pod a workflow owns.
	Cover Coverage
	// StoreFirst decides exit-handler pods from the store when it holds no completion for the
	// workflow, with no live read; the live read then only confirms a denial. Lower latency,
	// but a guard whose own watch lags admits a stale pod it would have refused.
	StoreFirst bool
	// LiveReadTimeout bounds one attempt of the live read of the owning workflow; past it
	// another attempt starts beside it.
	LiveReadTimeout time.Duration
	// LiveReadBudget bounds the live read in all, retries included; past it
	// the store decides, as StoreFallback says. It is the budget of an exit-handler or agent
	// pod and of a TaskSet write: one or two a workflow.
	LiveReadBudget time.Duration
	// HookStepReadBudget bounds the live read of a lifecycle-hook or step pod's workflow: many
	// a workflow, which Argo's controller sends one after another within one pass. One attempt
	// takes at most a third of it (or LiveReadTimeout, the shorter).
	HookStepReadBudget time.Duration
	// GetBesideListAfter is how long the LIST of a live read may go unanswered before a GET of
	// the workflow starts beside it, the first answer winning.
	GetBesideListAfter time.Duration
	// TaskSetRepeatsFor is how long after a TaskSet create admitted on a live read the same
	// create is admitted without one (row T7; at most createMemory; negative: every create is
	// read).
	TaskSetRepeatsFor time.Duration
	// EventReadTimeout and EventReadBudget are LiveReadTimeout and LiveReadBudget for the
	// workflow of an Event.
	EventReadTimeout time.Duration
	EventReadBudget  time.Duration
	// StoreFallback is what the store alone may refuse when no live read answered within the
	// budget.
	StoreFallback StoreFallback
	// StoreFreshFor is how recently the watch must have advanced for FallbackFresh to refuse
	// from a completion only the store holds: how young its newest write must be.
	StoreFreshFor time.Duration
	// StoreRefusalsFor bounds how long the store alone refuses one workflow's objects: past
	// it, counted from the first refusal no live read has confirmed since, a completion only
	// the store holds admits them as unconfirmed-completion (logged, counted, alerted) until
	// a live read answers again.
	StoreRefusalsFor time.Duration
	// Namespaces limits the guard to these namespaces (all when empty); pods elsewhere are
	// admitted at once.
	Namespaces []string
	// MaxConcurrentDecisions bounds the decisions in flight: one past it reads
	// nothing live and the store decides, counted as a live-read failure of kind shed.
	MaxConcurrentDecisions int
	// ExpectedRequester is the user that sends what the guard judges: Argo's workflow
	// controller, as system:serviceaccount:<namespace>:<name>. A refusal of a request from
	// anyone else is still a refusal, but counted apart
	// (exit_guard_unexpected_requester_decisions_total, not exit_guard_decisions_total), logged
	// with the requester, and its Event is Normal with a reason of its own. Empty: every
	// requester is expected.
	ExpectedRequester string
	// Registerer receives the guard's metrics (nil: controller-runtime's registry).
	Registerer prometheus.Registerer
	// EventSource is the reportingController of the guard's Events.
	EventSource string
}

func (o *Options) complete() error {
	def := DefaultOptions()
	var errs []error
	if o.Mode == "" {
		o.Mode = def.Mode
	}
	if _, err := ParseMode(string(o.Mode)); err != nil {
		errs = append(errs, err)
	}
	if len(o.DenyPhases) == 0 {
		o.DenyPhases = def.DenyPhases
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
		o.LiveReadTimeout = def.LiveReadTimeout
	}
	if o.LiveReadBudget < 0 {
		errs = append(errs, fmt.Errorf("live read budget must not be negative, got %s", o.LiveReadBudget))
	}
	if o.LiveReadBudget == 0 {
		o.LiveReadBudget = max(def.LiveReadBudget, o.LiveReadTimeout)
	}
	if o.LiveReadTimeout > o.LiveReadBudget {
		errs = append(errs, fmt.Errorf("live read timeout %s is longer than the live read budget %s", o.LiveReadTimeout, o.LiveReadBudget))
	}
	if o.HookStepReadBudget < 0 {
		errs = append(errs, fmt.Errorf("hook and step read budget must not be negative, got %s", o.HookStepReadBudget))
	}
	if o.HookStepReadBudget == 0 {
		o.HookStepReadBudget = def.HookStepReadBudget
	}
	if o.GetBesideListAfter == 0 {
		o.GetBesideListAfter = def.GetBesideListAfter
	}
	if o.TaskSetRepeatsFor == 0 {
		o.TaskSetRepeatsFor = def.TaskSetRepeatsFor
	}
	if o.TaskSetRepeatsFor > createMemory {
		errs = append(errs, fmt.Errorf("TaskSet repeats window %s is longer than %s, the memory of admitted creates", o.TaskSetRepeatsFor, createMemory))
	}
	if o.EventReadTimeout < 0 || o.EventReadBudget < 0 {
		errs = append(errs, fmt.Errorf("event read timeout and budget must not be negative, got %s and %s", o.EventReadTimeout, o.EventReadBudget))
	}
	if o.EventReadTimeout == 0 {
		o.EventReadTimeout = def.EventReadTimeout
	}
	if o.EventReadBudget == 0 {
		o.EventReadBudget = max(def.EventReadBudget, o.EventReadTimeout)
	}
	if o.EventReadTimeout > o.EventReadBudget {
		errs = append(errs, fmt.Errorf("event read timeout %s is longer than the event read budget %s", o.EventReadTimeout, o.EventReadBudget))
	}
	if o.StoreFallback == "" {
		o.StoreFallback = def.StoreFallback
	}
	if _, err := ParseStoreFallback(string(o.StoreFallback)); err != nil {
		errs = append(errs, err)
	}
	if o.StoreFreshFor < 0 {
		errs = append(errs, fmt.Errorf("store fresh-for must not be negative, got %s", o.StoreFreshFor))
	}
	if o.StoreFreshFor == 0 {
		o.StoreFreshFor = def.StoreFreshFor
	}
	if o.StoreRefusalsFor < 0 {
		errs = append(errs, fmt.Errorf("store refusals bound must not be negative, got %s", o.StoreRefusalsFor))
	}
	if o.StoreRefusalsFor == 0 {
		o.StoreRefusalsFor = def.StoreRefusalsFor
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
		o.MaxConcurrentDecisions = def.MaxConcurrentDecisions
	}
	if o.EventSource == "" {
		o.EventSource = def.EventSource
	}
	return errors.Join(errs...)
}

// Phases are terminal phases; as a flag, a comma-separated list (flag.Value).
type Phases []argo.Phase

// String lists the phases, comma-separated.
func (p Phases) String() string {
	names := make([]string, len(p))
	for i, ph := range p {
		names[i] = string(ph)
	}
	return strings.Join(names, ",")
}

// Set parses a comma-separated list of terminal phases (ParsePhases).
func (p *Phases) Set(s string) error { return parseInto(p, ParsePhases, s) }

// String is the mode's name; with Set, a Mode is a flag.Value.
func (m Mode) String() string { return string(m) }

// Set parses a mode name (ParseMode).
func (m *Mode) Set(s string) error { return parseInto(m, ParseMode, s) }

// String is the fallback's name; with Set, a StoreFallback is a flag.Value.
func (f StoreFallback) String() string { return string(f) }

// Set parses a store fallback name (ParseStoreFallback).
func (f *StoreFallback) Set(s string) error { return parseInto(f, ParseStoreFallback, s) }

// parseInto sets *p to parse(s), or leaves it and returns parse's error.
func parseInto[T any](p *T, parse func(string) (T, error), s string) error {
	v, err := parse(s)
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// ParsePhases parses a comma-separated list of terminal phases.
func ParsePhases(s string) (Phases, error) {
	var out Phases
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

// Coverage is which pods of a workflow the guard judges beyond its exit-handler and agent
// pods, which it always judges: the pods of lifecycle hooks (`hooks:` other than exit, at every
// level, and what runs under them) and of ordinary steps. The zero value covers both. As a
// flag, `all` or a comma-separated list of exit-handlers, hooks and steps (flag.Value).
type Coverage struct {
	// NoHooks leaves the pods of lifecycle hooks to Argo.
	NoHooks bool
	// NoSteps leaves the pods of ordinary steps to Argo.
	NoSteps bool
}

// Coverage names.
const (
	coverAll          = "all"
	coverExitHandlers = "exit-handlers"
	coverHooks        = "hooks"
	coverSteps        = "steps"
)

// Hooks says whether lifecycle-hook pods are judged.
func (c Coverage) Hooks() bool { return !c.NoHooks }

// Steps says whether step pods are judged.
func (c Coverage) Steps() bool { return !c.NoSteps }

// String is `all`, or the list of what is covered: exit-handlers, then hooks and steps where
// they are.
func (c Coverage) String() string {
	if c.Hooks() && c.Steps() {
		return coverAll
	}
	out := []string{coverExitHandlers}
	if c.Hooks() {
		out = append(out, coverHooks)
	}
	if c.Steps() {
		out = append(out, coverSteps)
	}
	return strings.Join(out, ",")
}

// Set parses a coverage (ParseCoverage).
func (c *Coverage) Set(s string) error { return parseInto(c, ParseCoverage, s) }

// ParseCoverage parses `all` or a comma-separated list of exit-handlers, hooks and steps.
// Exit-handler and agent pods are judged whatever the list says: `exit-handlers` alone covers
// only them.
func ParseCoverage(s string) (Coverage, error) {
	c := Coverage{NoHooks: true, NoSteps: true}
	seen := false
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "":
			continue
		case coverAll:
			c = Coverage{}
		case coverExitHandlers:
		case coverHooks:
			c.NoHooks = false
		case coverSteps:
			c.NoSteps = false
		default:
			return Coverage{}, fmt.Errorf("unknown coverage %q: want all, or a comma-separated list of exit-handlers, hooks and steps", strings.TrimSpace(f))
		}
		seen = true
	}
	if !seen {
		return Coverage{}, errors.New("no coverage given: want all, or a comma-separated list of exit-handlers, hooks and steps")
	}
	return c, nil
}
