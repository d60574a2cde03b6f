package webhook

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// guard holds what every admission path shares.
type guard struct {
	opts       Options
	store      *completionstore.Store
	reader     client.Reader
	recorder   events.EventRecorder
	metrics    *guardMetrics
	denyPhases map[argo.Phase]bool
	watched    map[string]bool // nil: every namespace
	// readLive is the live read of a workflow: liveRead, or in the decision table's test a
	// canned answer.
	readLive func(ctx context.Context, namespace, name string, p readPolicy) (*argo.Workflow, error)
	// readNodes reads a workflow whole with its node tree (row T6): liveNodes, or a stand-in.
	readNodes func(ctx context.Context, namespace, name string) (types.UID, argo.Phase, map[string]argo.Node, error)
	// readWhole GETs a workflow with its status' start (the overturns' check of a run unseen
	// between two completions): getWorkflow, or a stand-in.
	readWhole func(ctx context.Context, namespace, name string) (*argo.Workflow, error)
	// podRead, eventRead and hookStepRead are the live reads within --live-read-budget,
	// --event-read-budget and --hook-step-read-budget: each role reads as its kind says
	// (readPolicyOf).
	podRead, eventRead readPolicy
	hookStepRead       readPolicy
	// extraReads holds a token per further live-read attempt in flight (maxExtraLiveReads).
	extraReads chan struct{}
	// getBudget bounds the GETs beside slow LISTs to a share of the LISTs.
	getBudget *getBudget
	// slots holds a token per decision in flight (Options.MaxConcurrentDecisions), otherSlots
	// one per decision for an unexpected requester (an eighth of it, at least one).
	slots, otherSlots chan struct{}
	// overturns remembers the refusals made from the store alone, to tell when one was wrong.
	overturns *overturns
	// own is what each kind's own rows keep beside the guard (kindSpec.newOwn), by kind.
	own map[objectKind]any
	// argo keeps the Argo releases seen on the pods judged (argoversion.go): said, never
	// decided on.
	argo *argoVersions
}

// The live read GETs the owning Workflow (rbac on completionstore.Watch); the audit writes
// Events on it through the events.k8s.io API.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Setup registers the guard's admission paths, those of each of its kinds, on the manager's
// webhook server. Workflows are read live on a client of their own (liveClient: no
// cache, not the manager's connections), so the manager's scheme must know argo.Workflow
// (argo.AddToScheme).
func Setup(mgr manager.Manager, store *completionstore.Store, opts Options) error {
	if !mgr.GetScheme().Recognizes(argo.WorkflowGVK) {
		return errors.New("webhook: the manager's scheme does not know argo.Workflow; call argo.AddToScheme")
	}
	reader, err := newLiveClient(mgr.GetConfig(), mgr.GetScheme())
	if err != nil {
		return err
	}
	return setup(mgr, reader, store, opts)
}

// setup is Setup with the reader of live reads given.
func setup(mgr manager.Manager, reader client.Reader, store *completionstore.Store, opts Options) error {
	g, err := newGuard(reader, store, opts)
	if err != nil {
		return err
	}
	if !mgr.GetScheme().Recognizes(argo.WorkflowGVK) {
		return errors.New("webhook: the manager's scheme does not know argo.Workflow; call argo.AddToScheme")
	}
	g.recorder = mgr.GetEventRecorder(g.opts.EventSource)
	reg := g.opts.Registerer
	if reg == nil {
		reg = metrics.Registry
	}
	if err := g.metrics.register(reg); err != nil {
		return fmt.Errorf("webhook: registering metrics: %w", err)
	}
	g.metrics.initDecisions(g.opts.Mode)
	if err := reg.Register(g.overturns.counter); err != nil {
		return fmt.Errorf("webhook: registering metrics: %w", err)
	}
	if err := reg.Register(g.argo.gauge); err != nil {
		return fmt.Errorf("webhook: registering metrics: %w", err)
	}
	g.argo.log.Info("Argo Workflows' release is read from the executor image of the pods the guard judges, and said when first seen (exit_guard_argo_exposure); no pod seen yet")
	for _, k := range kinds {
		// At 0 from the start: its alert counts it with increase().
		g.overturns.counter.WithLabelValues(string(k.kind))
	}
	store.OnObserve(g.recovered("overturns", g.observedByStore))
	if err := mgr.Add(&overturnSweeper{g: g, interval: overturnSweepInterval}); err != nil {
		return fmt.Errorf("webhook: adding the overturn sweeper: %w", err)
	}
	srv := mgr.GetWebhookServer()
	for _, k := range kinds {
		if k.start != nil {
			if err := k.start(g, reg, store); err != nil {
				return fmt.Errorf("webhook: starting the rows of %s: %w", k.kind, err)
			}
		}
		srv.Register(k.path, g.path(k.path, k.read))
		if k.markPath != "" {
			srv.Register(k.markPath, markingPath(g, k))
		}
	}
	return nil
}

// recovered is fn, a listener of the store's observations, that recovers its own panic: it runs
// on the Workflow watch's goroutine (and on live reads'), where a panic would end the process
// and with it every replica's admissions alike. The observation goes unchecked by fn; the
// panic is counted (exit_guard_panics_total{where="store-listener"}, alert ExitGuardPanicked)
// and logged with its stack.
func (g *guard) recovered(name string, fn func(completionstore.Observation)) func(completionstore.Observation) {
	return func(o completionstore.Observation) {
		defer func() {
			if p := recover(); p != nil {
				g.metrics.panics.WithLabelValues(panicStoreListener).Inc()
				logf.Log.WithName("store-listener").Error(fmt.Errorf("panic: %v", p), "a check of the store's observations panicked; the observation goes unchecked",
					"listener", name, "workflow", o.Namespace+"/"+o.Name, "workflowUID", o.UID, "stack", string(debug.Stack()))
			}
		}()
		fn(o)
	}
}

// path is the pipeline of one admission path, reading its requests with read.
func (g *guard) path(path string, read func([]byte) (request, facts, *admission.Response)) *handler {
	return &handler{guard: g, read: read, log: logf.Log.WithName("admission").WithValues("webhook", path)}
}

// markingPath is the handler of a kind's markPath: the pipeline in warn and dry-run mode, where
// it marks suspect objects; in enforce mode it checks the request and changes nothing (the
// validating path decides), should the API server call it.
func markingPath(g *guard, k *kindSpec) *handler {
	h := g.path(k.markPath, k.read)
	if g.opts.Mode == ModeEnforce {
		h.readOnly = "enforce mode: the validating webhook decides"
	} else {
		h.mutating = true
	}
	return h
}

func newGuard(reader client.Reader, store *completionstore.Store, opts Options) (*guard, error) {
	if store == nil {
		return nil, errors.New("webhook: Setup needs a completion store")
	}
	if err := opts.complete(); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	g := &guard{opts: opts, store: store, reader: reader, metrics: newGuardMetrics(), denyPhases: map[argo.Phase]bool{},
		extraReads: make(chan struct{}, maxExtraLiveReads), getBudget: newGetBudget(),
		slots: make(chan struct{}, opts.MaxConcurrentDecisions), otherSlots: make(chan struct{}, max(1, opts.MaxConcurrentDecisions/8)),
		overturns: newOverturns(time.Now), own: map[objectKind]any{}, argo: newArgoVersions(logf.Log.WithName("argo-version"), opts.ExpectedRequester == "")}
	for _, k := range kinds {
		if k.newOwn != nil {
			g.own[k.kind] = k.newOwn(opts)
		}
	}
	g.readLive = g.liveRead
	g.readNodes = g.liveNodes
	g.readWhole = g.getWorkflow
	for _, p := range opts.DenyPhases {
		g.denyPhases[p] = true
	}
	g.podRead = readPolicy{attempt: g.opts.LiveReadTimeout, budget: g.opts.LiveReadBudget, getAfter: g.opts.GetBesideListAfter, refuses: g.denyPhases}
	g.hookStepRead = readPolicy{attempt: min(g.opts.LiveReadTimeout, g.opts.HookStepReadBudget/3), budget: g.opts.HookStepReadBudget,
		getAfter: g.opts.GetBesideListAfter, refuses: g.denyPhases}
	g.eventRead = readPolicy{attempt: g.opts.EventReadTimeout, budget: g.opts.EventReadBudget, getAfter: g.opts.GetBesideListAfter,
		refuses: map[argo.Phase]bool{argo.PhaseSucceeded: true}}
	if len(opts.Namespaces) > 0 {
		g.watched = map[string]bool{}
		for _, ns := range opts.Namespaces {
			g.watched[ns] = true
		}
	}
	return g, nil
}
