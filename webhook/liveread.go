package webhook

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// readPolicy is how one kind of decision reads a workflow live: the time of an attempt and of
// the whole read, and the phases that would refuse, which are read from status.phase only.
type readPolicy struct {
	attempt, budget time.Duration
	// getAfter: a LIST unanswered for this long gets a GET beside it (negative: never).
	getAfter time.Duration
	refuses  map[argo.Phase]bool
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
func (g *guard) liveRead(ctx context.Context, namespace, name string, p readPolicy) (*argo.Workflow, error) {
	// Not the request's cancellation: controller-runtime derives it from the manager's
	// context, which ends at shutdown while the server still finishes the requests in flight;
	// their reads would fail and the store would decide them. The budget bounds the read.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.budget)
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
		stack    []byte
	}
	done := make(chan answer, maxLiveReadAttempts)
	attempts, answered := 1, 0
	// The attempts still out when the decision is made (or when this goroutine hands a panic
	// on) answer later, into done: a panic among them can reach no request, so it is logged
	// and counted rather than dropped.
	defer func() {
		if late := attempts - answered; late > 0 {
			go func() {
				for range late {
					if a := <-done; a.panicked != nil {
						g.latePanic(namespace, name, a.panicked, a.stack)
					}
				}
			}()
		}
	}()
	// whole: the attempt GETs the whole object rather than LIST again. A hedge does (fresh:
	// on a connection of its own), and so does the retry of a LIST answered 429: the API
	// server refuses LISTs by name so while its watch cache (re)initializes, and a GET goes
	// to etcd.
	attempt := func(extra, whole, fresh bool) {
		if extra {
			defer func() { <-g.extraReads }()
		}
		// A panic here would end the process: hand it to the request's goroutine, whose
		// panic the pipeline recovers into an HTTP 500 (handler.serve).
		defer func() {
			if p := recover(); p != nil {
				done <- answer{panicked: p, stack: debug.Stack()}
			}
		}()
		actx := ctx
		if fresh {
			// A hedge: not behind whatever holds the attempt it hedges.
			actx = onFreshConnection(ctx)
		}
		wf, err := g.readWorkflow(actx, namespace, name, whole, p)
		done <- answer{wf: wf, err: err}
	}
	go attempt(false, false, false)
	next := time.NewTimer(p.attempt)
	defer next.Stop()
	delay := firstRetryDelay
	cause := "hedged" // why the next attempt starts
	getNext := false  // the next attempt GETs the whole object
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
				next.Reset(min(time.Duration(float64(delay)*(0.8+0.4*rand.Float64())), p.attempt)) //nolint:gosec // G404: jitter, not a secret
				delay *= 2
				cause = "error"
				getNext = getNext || apierrors.IsTooManyRequests(a.err)
			}
		case <-next.C:
			if attempts == maxLiveReadAttempts {
				continue
			}
			select {
			case g.extraReads <- struct{}{}:
			default:
				g.metrics.liveReadAttempts.WithLabelValues("shed").Inc()
				next.Reset(p.attempt)
				continue
			}
			g.metrics.liveReadAttempts.WithLabelValues(cause).Inc()
			attempts++
			go attempt(true, cause == "hedged" || getNext, cause == "hedged")
			next.Reset(p.attempt)
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
//
// A LIST that has not answered within p.getAfter gets a GET of the whole object beside it, the
// first answer winning: the LIST waits for the API server's watch cache to catch up with etcd,
// and that wait makes the read's tail, while a GET goes to etcd at once. Both are consistent
// reads (no resourceVersion), so either answer is the workflow as it is now or later. The GET
// takes a token of the further attempts (maxExtraLiveReads): none free, the LIST alone.
func (g *guard) readWorkflow(ctx context.Context, namespace, name string, whole bool, p readPolicy) (*argo.Workflow, error) {
	if whole {
		return g.getWorkflow(ctx, namespace, name)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the loser ends with the winner
	type answer struct {
		wf  *argo.Workflow
		err error
		// get: the answer is the GET's (the whole object), not the LIST's.
		get      bool
		panicked any
		stack    []byte
	}
	// Buffered for both: the loser sends and ends on its own.
	done := make(chan answer, 2)
	// A panic in either is handed to this goroutine, whose caller hands it on (liveRead); one
	// that comes after this read returned is logged and counted.
	recovered := func(get bool) {
		if p := recover(); p != nil {
			done <- answer{get: get, panicked: p, stack: debug.Stack()}
		}
	}
	pending := 1
	defer func() {
		if pending > 0 {
			go func(late int) {
				for range late {
					if a := <-done; a.panicked != nil {
						g.latePanic(namespace, name, a.panicked, a.stack)
					}
				}
			}(pending)
		}
	}()
	g.getBudget.earn()
	go func() {
		defer recovered(false)
		wf, err := g.listWorkflow(ctx, namespace, name, p.refuses)
		done <- answer{wf: wf, err: err}
	}()
	var besides <-chan time.Time
	if p.getAfter > 0 {
		t := time.NewTimer(p.getAfter)
		defer t.Stop()
		besides = t.C
	}
	var listed answer
	for pending > 0 {
		select {
		case a := <-done:
			pending--
			switch {
			case a.panicked != nil:
				panic(a.panicked)
			case a.get:
				// The whole object: what the LIST would have led to at best.
				if a.err == nil || pending == 0 {
					return a.wf, a.err
				}
				// The GET failed; the LIST may still answer.
			case a.err == nil && a.wf != nil:
				return a.wf, nil
			case a.err != nil && pending == 0:
				return nil, a.err
			case a.err != nil:
				// The LIST failed; the GET in flight may still answer.
				listed = a
			default:
				// The LIST found the workflow, and its labels did not settle the phase (or
				// would refuse): the whole object decides, from the GET in flight or one now.
				if pending == 0 {
					return g.getWorkflow(ctx, namespace, name)
				}
				listed = a
			}
		case <-besides:
			besides = nil
			if !g.getBudget.spend() {
				// Past its share: an API server slow enough that many LISTs wait must not
				// get a GET for each of them too.
				g.metrics.liveReadAttempts.WithLabelValues("shed").Inc()
				continue
			}
			select {
			case g.extraReads <- struct{}{}:
			default:
				g.metrics.liveReadAttempts.WithLabelValues("shed").Inc()
				continue
			}
			g.metrics.liveReadAttempts.WithLabelValues("get-beside-list").Inc()
			pending++
			go func() {
				defer recovered(true)
				defer func() { <-g.extraReads }()
				wf, err := g.getWorkflow(ctx, namespace, name)
				done <- answer{wf: wf, err: err, get: true}
			}()
		}
	}
	return nil, listed.err
}

// listWorkflow LISTs the workflow's metadata by name. It returns the workflow with the phase
// its labels settle, when they settle one that does not refuse; nil and no error when the
// whole object must decide; a NotFound when no workflow has the name.
func (g *guard) listWorkflow(ctx context.Context, namespace, name string, refuses map[argo.Phase]bool) (*argo.Workflow, error) {
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
	if phase := argo.PhaseFromLabels(found.Labels); phase != argo.PhaseUnsettled && !refuses[phase] {
		return &argo.Workflow{ObjectMeta: found.ObjectMeta, Status: argo.WorkflowStatus{Phase: phase}}, nil
	}
	return nil, nil
}

// getWorkflow GETs the whole workflow, decoding its metadata and status.phase.
func (g *guard) getWorkflow(ctx context.Context, namespace, name string) (*argo.Workflow, error) {
	wf := &argo.Workflow{}
	if err := g.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, wf); err != nil {
		return nil, err
	}
	return wf, nil
}

// Where a recovered panic happened: the label of exit_guard_panics_total.
const (
	panicAdmission     = "admission"
	panicLiveRead      = "live-read"
	panicStoreListener = "store-listener"
)

// latePanic logs and counts a panic of a read of namespace/name that came after its decision
// was made from another read: it can reach no request.
func (g *guard) latePanic(namespace, name string, p any, stack []byte) {
	g.metrics.panics.WithLabelValues(panicLiveRead).Inc()
	logf.Log.WithName("live-read").Error(fmt.Errorf("panic: %v", p), "a live read panicked after its decision was made from another read; the decision stands",
		"workflow", namespace+"/"+name, "stack", string(stack))
}

// permanent says whether a failed read would fail again however often it is retried.
func permanent(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsBadRequest(err)
}

const (
	// getBesideShare is the share of LISTs that may get a GET beside them: one in 20. The
	// GET is there for the tail (a LIST slower than its usual p99); when most LISTs are slow,
	// the API server is struggling, and a GET for each would add as many reads as it is
	// already failing to serve (measured: with no bound, exit handlers at 500/s had a p99 of
	// 571 ms, docs/evidence/performance.md).
	getBesideShare = 0.05
	// getBesideBurst is how many GETs beside may start at once after a quiet spell.
	getBesideBurst = 10
)

// getBudget is a token bucket: each LIST earns getBesideShare of a token, up to
// getBesideBurst; a GET beside a slow LIST spends a whole one.
type getBudget struct {
	mu     sync.Mutex
	tokens float64
}

func newGetBudget() *getBudget { return &getBudget{tokens: getBesideBurst} }

func (b *getBudget) earn() {
	b.mu.Lock()
	b.tokens = min(b.tokens+getBesideShare, getBesideBurst)
	b.mu.Unlock()
}

func (b *getBudget) spend() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
