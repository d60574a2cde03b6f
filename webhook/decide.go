package webhook

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// podKind says what part of a workflow a pod runs.
type podKind string

const (
	kindExitHandler podKind = "exit-handler"
	kindHook        podKind = "lifecycle-hook"
	kindStep        podKind = "step"
	// kindAgent is Argo's agent pod, which runs the workflow's HTTP and plugin templates:
	// exit handlers too. Argo creates it only while the workflow runs and deletes it when the
	// workflow completes, so an agent pod for a completed workflow comes from a stale copy.
	kindAgent podKind = "agent"
)

// reason is a stable code for a decision, used in metrics, logs and audit annotations.
type reason string

// Reasons to admit.
const (
	reasonNotWorkflowPod      reason = "not-owned-by-workflow"
	reasonSpecialPod          reason = "artifact-gc-or-other-component"
	reasonNotCovered          reason = "not-covered-by-policy"
	reasonNamespaceNotWatched reason = "namespace-not-watched"
	reasonWorkflowActive      reason = "workflow-not-terminal"
	reasonPhaseAllowed        reason = "phase-not-denied"
	reasonNotSeenCompleted    reason = "not-seen-completed"
	reasonUnverified          reason = "unverified-fail-open"
	// reasonUnconfirmedCompletion: the store says completed, no live read answered, and the
	// store fallback lets only tombstones refuse.
	reasonUnconfirmedCompletion reason = "unconfirmed-completion"
)

// Reasons to refuse.
const (
	reasonWorkflowCompleted reason = "workflow-completed"
	reasonWorkflowDeleted   reason = "workflow-deleted"
	reasonWorkflowReplaced  reason = "workflow-replaced"
)

// source says how the guard knew the workflow's state.
type source string

const (
	sourceNone  source = ""
	sourceStore source = "store"
	sourceLive  source = "live-read"
)

// objectKind is the kind of object an admission request is about.
type objectKind string

const (
	objectPod     objectKind = "Pod"
	objectTaskSet objectKind = argo.TaskSetKind
)

// facts is what the guard reads from the object of a request: a pod's metadata, or what a
// WorkflowTaskSet write adds.
type facts struct {
	object    objectKind
	namespace string
	name      string // or generateName + "*" when the name is not set yet
	node      string
	kind      podKind
	owner     *metav1.OwnerReference
	// Of a WorkflowTaskSet write: the task keys (node IDs) it adds, and whether it turns the
	// completed label from "true" back.
	tasks    []string
	reopened bool
}

// decision is the guard's verdict on one pod, before the mode is applied.
type decision struct {
	deny   bool
	reason reason
	source source
	// The owning workflow, when there is one.
	wfNamespace, wfName string
	wfUID               types.UID
	phase               argo.Phase
	resourceVersion     string
	// liveErr is the live read's failure, when the store decided instead.
	liveErr error
}

// classify reads a pod's metadata: who owns it and what it runs. owner is nil for a pod that
// has no controlling Workflow (artifact-GC pods are owned by WorkflowArtifactGCTask).
func classify(meta *metav1.ObjectMeta) facts {
	f := facts{object: objectPod, namespace: meta.Namespace, name: meta.Name, node: meta.Annotations[argo.AnnotationNodeName]}
	if f.name == "" && meta.GenerateName != "" {
		f.name = meta.GenerateName + "*"
	}
	if ref := metav1.GetControllerOfNoCopy(meta); ref != nil && ref.Kind == argo.Kind && apiGroup(ref.APIVersion) == argo.Group {
		f.owner = ref
	}
	_, onExitLabel := meta.Labels[argo.LabelOnExit]
	switch {
	case meta.Labels[argo.LabelComponent] == argo.ComponentAgent:
		f.kind = kindAgent
	case onExitLabel || strings.Contains(f.node, argo.OnExitMarker):
		// The label is Argo's own mark; the node name is a second signal (a step may be
		// named onExit, which costs that pod a live read, never a wrong denial).
		f.kind = kindExitHandler
	case strings.Contains(f.node, argo.HooksMarker):
		f.kind = kindHook
	default:
		f.kind = kindStep
	}
	return f
}

func apiGroup(apiVersion string) string {
	if i := strings.IndexByte(apiVersion, '/'); i >= 0 {
		return apiVersion[:i]
	}
	return ""
}

// covered says whether the policy concerns pods of kind k.
func (g *guard) covered(k podKind) bool {
	switch k {
	case kindExitHandler, kindAgent:
		return true
	case kindHook:
		return g.opts.Hooks || g.opts.Strict
	default:
		return g.opts.Strict
	}
}

// decide is the decision table of docs/decisions.md.
func (g *guard) decide(ctx context.Context, meta *metav1.ObjectMeta) (facts, decision) {
	f := classify(meta)
	if f.owner == nil {
		return f, decision{reason: reasonNotWorkflowPod}
	}
	d := decision{wfNamespace: f.namespace, wfName: f.owner.Name, wfUID: f.owner.UID}
	if c := meta.Labels[argo.LabelComponent]; c != "" && c != argo.ComponentAgent {
		// Artifact-GC pods run after completion by design.
		d.reason = reasonSpecialPod
		return f, d
	}
	if g.watched != nil && !g.watched[f.namespace] {
		d.reason = reasonNamespaceNotWatched
		return f, d
	}
	if !g.covered(f.kind) {
		d.reason = reasonNotCovered
		return f, d
	}
	// Exit handlers get a live read first unless store-first is set; ordinary step pods
	// (strict mode) always go store-first, so that the common case costs no API call.
	return f, g.judge(ctx, d, g.opts.StoreFirst || f.kind == kindStep)
}

// judge decides for an object the policy covers, of the workflow d names. A store-first
// decision admits from the store when it holds nothing to refuse, and reads live only to be
// sure of a refusal. A store whose watch has stopped advancing may lack completions: it is
// asked nothing until the watch moves again.
func (g *guard) judge(ctx context.Context, d decision, storeFirst bool) decision {
	if storeFirst && g.store.WatchFresh() {
		rec, ok := g.store.Get(d.wfUID)
		if !ok {
			d.reason, d.source = reasonNotSeenCompleted, sourceStore
			return d
		}
		if fromStore := g.fromRecord(d, rec); !fromStore.deny && rec.Phase != argo.PhaseUnsettled {
			return fromStore
		}
		// The store says refuse, or cannot tell: be sure first.
	}
	return g.liveDecide(ctx, d)
}

// liveDecide reads the owner from the API server and decides from what it says, or from the
// store when the read fails or runs out of time.
func (g *guard) liveDecide(ctx context.Context, d decision) decision {
	wf, err := g.liveRead(ctx, d.wfNamespace, d.wfName)
	switch {
	case apierrors.IsNotFound(err):
		d.deny, d.reason, d.source = true, reasonWorkflowDeleted, sourceLive
		return d
	case err != nil:
		rec, ok := g.store.Get(d.wfUID)
		if !ok {
			d.reason, d.liveErr = reasonUnverified, err
			return d
		}
		d = g.fromRecord(d, rec)
		d.liveErr = err
		if d.deny && d.reason == reasonWorkflowCompleted && g.opts.StoreFallback != FallbackCompletion {
			// The store's completion may be a retry not yet delivered: not sure enough.
			d.deny, d.reason = false, reasonUnconfirmedCompletion
		}
		return d
	case wf.UID != d.wfUID:
		// The name now belongs to another workflow: the pod's owner was deleted.
		d.deny, d.reason, d.source = true, reasonWorkflowReplaced, sourceLive
		return d
	}
	// A consistent read is the truth; let the store learn from it too (it keeps the newest).
	g.store.Observe(completionstore.ObservationOf(wf, false))
	d.source, d.phase, d.resourceVersion = sourceLive, wf.Status.Phase, wf.ResourceVersion
	return g.byPhase(d)
}

// fromRecord decides from what the store holds.
func (g *guard) fromRecord(d decision, rec completionstore.Record) decision {
	d.source, d.phase, d.resourceVersion = sourceStore, rec.Phase, rec.ResourceVersion
	switch {
	case rec.Deleted:
		d.deny, d.reason = true, reasonWorkflowDeleted
		return d
	case rec.Phase == argo.PhaseUnsettled:
		// Seen without its status, and its labels did not tell its phase.
		d.reason = reasonUnverified
		return d
	}
	return g.byPhase(d)
}

// byPhase decides from a workflow's phase: Argo creates a legitimate exit-handler pod only
// while the workflow is not terminal, so a terminal phase means a stale copy.
func (g *guard) byPhase(d decision) decision {
	switch {
	case !d.phase.Terminal():
		d.reason = reasonWorkflowActive
	case g.denyPhases[d.phase]:
		d.deny, d.reason = true, reasonWorkflowCompleted
	default:
		d.reason = reasonPhaseAllowed
	}
	return d
}

// errLiveReadTimeout marks a live read that ran out of its budget.
var errLiveReadTimeout = errors.New("live read of the workflow ran out of time")

const (
	// maxLiveReadAttempts bounds the attempts of one live read: a hedge per attempt timeout
	// and a few quick retries fit in the default budget (4 s of 1 s attempts).
	maxLiveReadAttempts = 8
	// maxExtraLiveReads bounds, across the process, the further attempts (retries and hedges)
	// in flight: an API server slow enough to need them must not get a multiple of the
	// admission rate in GETs. A decision whose further attempt finds no room waits for the
	// next turn; its first attempt is never held back.
	maxExtraLiveReads = 32
	// firstRetryDelay is the pause after an attempt that failed fast (a refused connection, a
	// 429 or 5xx answer); it doubles with each retry.
	firstRetryDelay = 50 * time.Millisecond
)

// liveRead reads the workflow from the API server within the live-read budget, consistently
// (no resourceVersion: never an older state than the newest write), and returns its metadata
// and status.phase.
//
// An admission costs the same for a workflow of a megabyte as for a small one: the read LISTs
// the workflow's metadata by name (a fieldSelector on metadata.name, which the API server
// answers from one key of its watch cache once that cache has caught up with etcd), and takes
// the phase from the labels Argo writes with it. Only when the labels do not settle the phase
// (argo.PhaseFromLabels), or settle it on one that would refuse, does it GET the whole object,
// decoding only metadata and status.phase: a refusal is always decided from the status.
//
// The budget is used whole: an attempt that fails fast is retried after a short pause, and one
// that has not answered within the attempt timeout gets another attempt beside it (a hedge),
// the first answer winning. A 404 is an answer; 401, 403 and 400 end the read at once, as no
// retry mends them.
func (g *guard) liveRead(ctx context.Context, namespace, name string) (*argo.Workflow, error) {
	// Not the request's cancellation: controller-runtime derives it from the manager's
	// context, which ends at shutdown while the server still finishes the requests in flight;
	// their reads would fail and the store would decide them. The budget bounds the read.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.opts.LiveReadBudget)
	defer cancel()
	start := time.Now()
	// Attempts run aside and the decision waits for them only until the budget runs out: an
	// HTTP client does not always give up at its context's deadline (an HTTP/2 connection
	// that is still being dialled is shared and outlives one request), and the API server must
	// never see the webhook time out. The channel holds every attempt's answer, so that a
	// late attempt ends on its own.
	type answer struct {
		wf       *argo.Workflow
		err      error
		panicked any
	}
	done := make(chan answer, maxLiveReadAttempts)
	// whole: a hedge GETs the whole object rather than LIST again: a LIST by name that has
	// not answered within the attempt timeout is most often one the API server answers 429
	// while its watch cache (re)initializes, which client-go retries on its own after each
	// Retry-After; a GET goes to etcd.
	attempt := func(extra, whole bool) {
		if extra {
			defer func() { <-g.extraReads }()
		}
		// A panic here would end the process: hand it to the request's goroutine, whose
		// panic controller-runtime recovers into an HTTP error (withHTTPStatus).
		defer func() {
			if p := recover(); p != nil {
				done <- answer{panicked: p}
			}
		}()
		wf, err := g.readWorkflow(ctx, namespace, name, whole)
		done <- answer{wf: wf, err: err}
	}
	attempts, answered := 1, 0
	go attempt(false, false)
	next := time.NewTimer(g.opts.LiveReadTimeout)
	defer next.Stop()
	delay := firstRetryDelay
	cause := "hedged" // why the next attempt starts
	var a answer
loop:
	for {
		select {
		case a = <-done:
			answered++
			switch {
			case a.panicked != nil:
				panic(a.panicked)
			case a.err == nil, apierrors.IsNotFound(a.err), permanent(a.err):
				break loop
			case answered == maxLiveReadAttempts:
				// Every attempt there may be has failed: waiting out the budget gains nothing.
				break loop
			default:
				// This attempt failed: retry after a pause (jittered, so that decisions
				// that failed together do not retry together), not later than a hedge would.
				next.Reset(min(time.Duration(float64(delay)*(0.8+0.4*rand.Float64())), g.opts.LiveReadTimeout)) //nolint:gosec // G404: jitter, not a secret
				delay *= 2
				cause = "error"
			}
		case <-next.C:
			if attempts == maxLiveReadAttempts {
				continue
			}
			select {
			case g.extraReads <- struct{}{}:
			default:
				g.metrics.liveReadAttempts.WithLabelValues("shed").Inc()
				next.Reset(g.opts.LiveReadTimeout)
				continue
			}
			g.metrics.liveReadAttempts.WithLabelValues(cause).Inc()
			attempts++
			go attempt(true, cause == "hedged")
			next.Reset(g.opts.LiveReadTimeout)
			cause = "hedged"
		case <-ctx.Done():
			a.err = errors.Join(errLiveReadTimeout, a.err, ctx.Err())
			break loop
		}
	}
	result := "found"
	switch {
	case a.err == nil:
	case apierrors.IsNotFound(a.err):
		result = "not-found"
	case errors.Is(a.err, errLiveReadTimeout):
		result = "timeout"
	default:
		result = "error"
	}
	g.metrics.liveRead.WithLabelValues(result).Observe(time.Since(start).Seconds())
	return a.wf, a.err
}

// readWorkflow is one attempt of liveRead: the metadata by name, and the whole object when
// the labels do not settle the phase, or settle it on one that would refuse: a refusal is
// decided from status.phase only, so that labels can at worst admit what the status would
// refuse, never refuse what it would admit. whole skips the LIST.
func (g *guard) readWorkflow(ctx context.Context, namespace, name string, whole bool) (*argo.Workflow, error) {
	if !whole {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(argo.WorkflowListGVK)
		if err := g.reader.List(ctx, list, client.InNamespace(namespace), client.MatchingFields{"metadata.name": name}); err != nil {
			return nil, err
		}
		var found *metav1.PartialObjectMetadata
		for i := range list.Items {
			if list.Items[i].Name == name {
				found = &list.Items[i]
			}
		}
		if found == nil {
			return nil, apierrors.NewNotFound(schema.GroupResource{Group: argo.Group, Resource: argo.Resource}, name)
		}
		if phase := argo.PhaseFromLabels(found.Labels); phase != argo.PhaseUnsettled && !g.denyPhases[phase] {
			return &argo.Workflow{ObjectMeta: found.ObjectMeta, Status: argo.WorkflowStatus{Phase: phase}}, nil
		}
	}
	wf := &argo.Workflow{}
	if err := g.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, wf); err != nil {
		return nil, err
	}
	return wf, nil
}

// permanent says whether a failed read would fail again however often it is retried.
func permanent(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsBadRequest(err)
}
