package webhook

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// The randomized simulation: thousands of random workflow histories, each driven through the
// real decision code (guard.decide with its live read, and completionstore.Store) in virtual
// time, with an oracle that knows the true history. `make test` runs a short fixed-seed
// version; `make soak` runs 100,000 histories and writes the report of docs/reliability.md.
var (
	simHistories = flag.Int("sim.histories", 3000, "simulation: how many random workflow histories")
	simSeed      = flag.Uint64("sim.seed", 1, "simulation: the seed of the first history; history i uses seed+i")
	simReplay    = flag.Int64("sim.replay", -1, "simulation: replay only the history of this seed, printing every step")
	simReport    = flag.String("sim.report", "", "simulation: write the report, as Markdown, to this file")
)

// simT0 is the virtual clock's origin.
var simT0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// wfState is the true state of one workflow UID after a write.
type wfState struct {
	uid     types.UID
	rv      int64
	phase   argo.Phase
	deleted bool
}

// write is a change of the truth at a moment.
type write struct {
	at    time.Duration
	state wfState
}

// kindTaskSetWrite marks an event that is not a pod: a write of the workflow's WorkflowTaskSet
// that adds a task (and, from a stale copy, sets the completed label back), decided by the
// TaskSet webhook.
const kindTaskSetWrite podKind = "taskset-write"

// podEvent is a pod creation, or a TaskSet write that adds a task: by the real controller
// (legit) or by a stale copy.
type podEvent struct {
	at    time.Duration
	uid   types.UID
	kind  podKind
	stale bool
}

// loadLevel is how loaded the API server is during a history: how late the guard's watch
// delivers, and how often the guard's live reads fail.
type loadLevel struct {
	name string
	// lagMean is the mean watch delay (exponential).
	lagMean time.Duration
	// stallProb is the chance that the watch stalls once, for stall.
	stallProb float64
	stall     time.Duration
	// attemptFail is the chance that one live-read attempt fails; outage the chance that
	// every attempt of a decision fails (the API server cannot answer at all).
	attemptFail, outage float64
}

// The load levels and their shares. These are assumptions, stated in docs/reliability.md: the
// figures scale with them.
var loadLevels = []struct {
	share float64
	level loadLevel
}{
	{0.70, loadLevel{name: "idle", lagMean: 20 * time.Millisecond, attemptFail: 0.001}},
	{0.25, loadLevel{name: "loaded", lagMean: 2 * time.Second, stallProb: 0.1, stall: 30 * time.Second, attemptFail: 0.2, outage: 0.05}},
	{0.05, loadLevel{name: "overloaded", lagMean: 15 * time.Second, stallProb: 0.5, stall: 5 * time.Minute, attemptFail: 0.5, outage: 0.3}},
}

// watchAction is something the guard's watch does to its store at a moment.
type watchAction struct {
	at time.Duration
	// obs is an observation to feed (an event, a replayed event, a relist's state or its
	// DeletedFinalStateUnknown); restart replaces the store with an empty one first.
	obs      *completionstore.Observation
	restart  bool
	bookmark int64 // a bookmark's resourceVersion, when set
	what     string
}

// history is one generated world: the truth, the pods, and what the guard's watch delivers.
type history struct {
	seed   uint64
	load   loadLevel
	writes []write // in time order; resourceVersions increase with time
	pods   []podEvent
	watch  []watchAction
	// plans says, per pod event, which live-read attempts fail.
	plans [][]bool
}

const (
	simNamespace = "sim"
	simName      = "wf"
)

func dur(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// generate makes the history of seed.
func generate(seed uint64) *history {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h := &history{seed: seed}
	x := r.Float64()
	for _, l := range loadLevels {
		if x < l.share {
			h.load = l.level
			break
		}
		x -= l.share
	}
	if h.load.name == "" {
		h.load = loadLevels[len(loadLevels)-1].level
	}
	var rv int64 = 100
	put := func(at time.Duration, s wfState) {
		rv++
		s.rv = rv
		h.writes = append(h.writes, write{at: at, state: s})
	}
	pod := func(at time.Duration, uid types.UID, kind podKind, stale bool) {
		h.pods = append(h.pods, podEvent{at: at, uid: uid, kind: kind, stale: stale})
	}
	// lifecycle runs one workflow from its creation to its last completion and returns when
	// it ended, and the moments it completed.
	lifecycle := func(uid types.UID, t time.Duration) (time.Duration, []time.Duration) {
		http := r.Float64() < 0.3
		put(t, wfState{uid: uid})
		var completions []time.Duration
		run := func(t time.Duration, phase argo.Phase) time.Duration {
			put(t, wfState{uid: uid, phase: phase})
			// A retry (or a start) creates the step pods first, at once; a workflow with
			// HTTP or plugin templates its agent pod.
			t += dur(r, 50*time.Millisecond, time.Second)
			if http {
				pod(t, uid, kindTaskSetWrite, false)
				pod(t, uid, kindAgent, false)
			}
			for range 1 + r.IntN(3) {
				pod(t, uid, kindStep, false)
				if r.Float64() < 0.3 {
					pod(t+time.Millisecond, uid, kindHook, false)
				}
				t += dur(r, 100*time.Millisecond, 5*time.Second)
			}
			if r.Float64() < 0.9 {
				pod(t, uid, kindExitHandler, false)
				if http {
					// The exit handler's HTTP task.
					pod(t, uid, kindTaskSetWrite, false)
				}
				t += dur(r, 100*time.Millisecond, 3*time.Second)
			}
			end := []argo.Phase{argo.PhaseSucceeded, argo.PhaseSucceeded, argo.PhaseSucceeded, argo.PhaseSucceeded,
				argo.PhaseSucceeded, argo.PhaseSucceeded, argo.PhaseSucceeded, argo.PhaseFailed, argo.PhaseFailed, argo.PhaseError}[r.IntN(10)]
			put(t, wfState{uid: uid, phase: end})
			completions = append(completions, t)
			return t
		}
		t = run(t+dur(r, 50*time.Millisecond, 500*time.Millisecond), argo.PhaseRunning)
		for r.Float64() < 0.2 {
			// argo retry: automation retries within seconds, people within minutes.
			if r.Float64() < 0.4 {
				t += dur(r, 500*time.Millisecond, 5*time.Second)
			} else {
				t += dur(r, 30*time.Second, 10*time.Minute)
			}
			retried := argo.PhaseRunning // up to 3.7
			if r.Float64() < 0.5 {
				retried = argo.PhaseUnknown // v4
			}
			t = run(t, retried)
		}
		return t, completions
	}
	stale := func(uid types.UID, completions []time.Duration) {
		for _, c := range completions {
			if r.Float64() >= 0.5 {
				continue
			}
			// A stale copy comes back soon after the completion, as a rule.
			at := c + dur(r, 10*time.Millisecond, 20*time.Second)
			if r.Float64() < 0.1 {
				at = c + dur(r, 20*time.Second, 15*time.Minute)
			}
			pod(at, uid, kindExitHandler, true)
			if r.Float64() < 0.5 {
				pod(at-time.Millisecond, uid, kindStep, true) // argo-workflows #16294
			}
			if r.Float64() < 0.3 {
				pod(at+time.Millisecond, uid, kindHook, true)
			}
			if r.Float64() < 0.3 {
				// An HTTP exit handler: the stale copy adds its task to the TaskSet and
				// creates a new agent pod.
				pod(at+time.Millisecond, uid, kindTaskSetWrite, true)
				pod(at+2*time.Millisecond, uid, kindAgent, true)
			}
		}
	}
	uid1 := types.UID(fmt.Sprintf("uid-%d-1", seed))
	end, completions := lifecycle(uid1, 0)
	stale(uid1, completions)
	if r.Float64() < 0.4 {
		// ttlStrategy deletes it; the name may be used again.
		del := end + dur(r, time.Second, 2*time.Minute)
		put(del, wfState{uid: uid1, phase: h.writes[len(h.writes)-1].state.phase, deleted: true})
		if r.Float64() < 0.5 {
			uid2 := types.UID(fmt.Sprintf("uid-%d-2", seed))
			_, c2 := lifecycle(uid2, del+dur(r, 100*time.Millisecond, 30*time.Second))
			stale(uid2, c2)
		}
		if r.Float64() < 0.3 {
			pod(del+dur(r, 10*time.Millisecond, 10*time.Second), uid1, kindExitHandler, true)
		}
	}
	// The second lifecycle's writes were appended after the deletion; keep time order (each
	// lifecycle's writes are in order; the stale pods are sorted below).
	sort.SliceStable(h.writes, func(i, j int) bool { return h.writes[i].at < h.writes[j].at })
	for i := range h.writes {
		h.writes[i].state.rv = 101 + int64(i)
	}
	sort.SliceStable(h.pods, func(i, j int) bool { return h.pods[i].at < h.pods[j].at })
	h.watch = h.generateWatch(r)
	for range h.pods {
		plan := make([]bool, maxLiveReadAttempts)
		outage := r.Float64() < h.load.outage
		for k := range plan {
			plan[k] = outage || r.Float64() < h.load.attemptFail
		}
		h.plans = append(h.plans, plan)
	}
	return h
}

// generateWatch makes what the guard's watch delivers: every write, late by a random lag, in
// order; perhaps a stall, a replayed older event, a relist, a restart of the guard.
func (h *history) generateWatch(r *rand.Rand) []watchAction {
	var out []watchAction
	lag := func() time.Duration {
		return time.Duration(r.ExpFloat64() * float64(h.load.lagMean))
	}
	last := h.writes[len(h.writes)-1].at
	var stallFrom, stallTo time.Duration = -1, -1
	if r.Float64() < h.load.stallProb {
		stallFrom = dur(r, 0, last)
		stallTo = stallFrom + h.load.stall
	}
	obsOf := func(s wfState) *completionstore.Observation {
		return &completionstore.Observation{UID: s.uid, Namespace: simNamespace, Name: simName,
			ResourceVersion: strconv.FormatInt(s.rv, 10), Phase: s.phase, Deleted: s.deleted}
	}
	var prev time.Duration
	for _, w := range h.writes {
		at := max(prev, w.at+lag())
		if at >= stallFrom && at < stallTo {
			at = stallTo
		}
		prev = at
		out = append(out, watchAction{at: at, obs: obsOf(w.state), what: "event"})
	}
	// Bookmarks about every minute while the watch is not stalled.
	for b := time.Minute; b < last+15*time.Minute; b += time.Minute {
		if b >= stallFrom && b < stallTo {
			continue
		}
		var rv int64
		for _, w := range h.writes {
			if w.at <= b-lag() {
				rv = w.state.rv
			}
		}
		if rv > 0 {
			out = append(out, watchAction{at: b, bookmark: rv, what: "bookmark"})
		}
	}
	// truthAt is every UID's state at t, as a list would return it.
	truthAt := func(t time.Duration) map[types.UID]wfState {
		m := map[types.UID]wfState{}
		for _, w := range h.writes {
			if w.at <= t {
				m[w.state.uid] = w.state
			}
		}
		return m
	}
	// deliveredAt is what the informer last had of each UID at t.
	deliveredAt := func(acts []watchAction, t time.Duration) map[types.UID]completionstore.Observation {
		m := map[types.UID]completionstore.Observation{}
		for _, a := range acts {
			if a.obs != nil && a.at <= t && !a.restart {
				m[a.obs.UID] = *a.obs
			}
		}
		return m
	}
	if r.Float64() < 0.2 && len(h.writes) > 1 {
		// A replayed older event (an informer that went back): the store must ignore it.
		w := h.writes[r.IntN(len(h.writes)-1)]
		o := obsOf(w.state)
		o.Deleted = false
		out = append(out, watchAction{at: dur(r, w.at, last+time.Minute), obs: o, what: "replayed older event"})
	}
	if r.Float64() < 0.2 {
		// A relist (410 Gone, or a broken watch): the current state of every workflow, and a
		// DeletedFinalStateUnknown, with the informer's last copy, for those gone meanwhile.
		t := dur(r, 0, last+time.Minute)
		had := deliveredAt(out, t)
		now := truthAt(t - lag())
		for uid, s := range now {
			if !s.deleted {
				out = append(out, watchAction{at: t, obs: obsOf(s), what: "relist"})
			} else if o, ok := had[uid]; ok && !o.Deleted {
				o.Deleted = true
				out = append(out, watchAction{at: t, obs: &o, what: "relist: DeletedFinalStateUnknown"})
			}
		}
	}
	if r.Float64() < 0.1 {
		// The guard restarts: an empty store, then the initial list once synced. Events that
		// arrive meanwhile are lost with the old process; the list brings the state.
		t := dur(r, 0, last)
		synced := t + dur(r, 100*time.Millisecond, 30*time.Second)
		var kept []watchAction
		for _, a := range out {
			if a.at <= t || a.at > synced {
				kept = append(kept, a)
			}
		}
		out = append(kept, watchAction{at: t, restart: true, what: "guard restart"})
		for _, s := range truthAt(synced - lag()) {
			if !s.deleted {
				out = append(out, watchAction{at: synced, obs: obsOf(s), what: "initial list"})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].at != out[j].at {
			return out[i].at < out[j].at
		}
		return out[i].restart && !out[j].restart
	})
	return out
}

// truth is the state of uid at t, and the UID that holds the name then (empty when none).
func (h *history) truth(uid types.UID, t time.Duration) (state wfState, seen bool, holder wfState) {
	for _, w := range h.writes {
		if w.at > t {
			break
		}
		if w.state.uid == uid {
			state, seen = w.state, true
		}
		if w.state.deleted {
			if holder.uid == w.state.uid {
				holder = wfState{}
			}
		} else {
			holder = w.state
		}
	}
	return state, seen, holder
}

// decisionPlan is one decision's live-read plan: which attempts fail, and the moment. It
// travels in the decision's context (the live read keeps its values), so that an attempt that
// starts late still belongs to its own decision.
type decisionPlan struct {
	mu     sync.Mutex
	now    time.Duration
	plan   []bool
	called int
}

type planKey struct{}

// next says whether the next attempt of the decision in ctx fails.
func nextAttemptFails(ctx context.Context) (now time.Duration, fail bool) {
	p, ok := ctx.Value(planKey{}).(*decisionPlan)
	if !ok {
		return 0, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.called
	p.called++
	return p.now, k >= len(p.plan) || p.plan[k]
}

// decisionMoment is the virtual moment of the decision in ctx.
func decisionMoment(ctx context.Context) time.Duration {
	p, ok := ctx.Value(planKey{}).(*decisionPlan)
	if !ok {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.now
}

// simReader answers live reads from the truth at the decision's virtual moment, failing the
// attempts its plan says.
type simReader struct {
	h *history
}

// List is the first read of each attempt (readWorkflow): the workflow's metadata by name, its
// labels written as Argo's controller writes them with its phase (none for a workflow not yet
// reconciled, whose phase only Get tells).
func (s *simReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	now, fail := nextAttemptFails(ctx)
	if fail {
		return apierrors.NewServiceUnavailable("simulated: the API server cannot answer")
	}
	var lo client.ListOptions
	lo.ApplyOptions(opts)
	name, _ := lo.FieldSelector.RequiresExactMatch("metadata.name")
	l := list.(*metav1.PartialObjectMetadataList)
	l.Items = nil
	if _, _, holder := s.h.truth("", now); holder.uid != "" {
		item := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: lo.Namespace, Name: name, UID: holder.uid,
			ResourceVersion: strconv.FormatInt(holder.rv, 10)}}
		if holder.phase != argo.PhaseUnknown {
			item.Labels = map[string]string{argo.LabelPhase: string(holder.phase), argo.LabelCompleted: strconv.FormatBool(holder.phase.Terminal())}
		}
		l.Items = append(l.Items, item)
	}
	return nil
}

// Get is the second read of an attempt whose labels did not settle the phase, at the same
// moment.
func (s *simReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	_, _, holder := s.h.truth("", decisionMoment(ctx))
	if holder.uid == "" {
		return apierrors.NewNotFound(schema.GroupResource{Group: argo.Group, Resource: argo.Resource}, key.Name)
	}
	wf := obj.(*argo.Workflow)
	wf.Namespace, wf.Name, wf.UID = key.Namespace, key.Name, holder.uid
	wf.ResourceVersion = strconv.FormatInt(holder.rv, 10)
	wf.Status.Phase = holder.phase
	return nil
}

// setting is a policy the simulation measures.
type setting struct {
	name string
	opts Options
}

var simSettings = []setting{
	{"default", Options{}},
	{"--store-first", Options{StoreFirst: true}},
	{"--strict", Options{Strict: true}},
	{"--cover-hooks", Options{Hooks: true}},
	{"--store-fallback=completion", Options{StoreFallback: FallbackCompletion}},
	{"--strict --store-fallback=completion", Options{Strict: true, StoreFallback: FallbackCompletion}},
	{"--deny-phases=Succeeded,Failed,Error", Options{DenyPhases: []argo.Phase{argo.PhaseSucceeded, argo.PhaseFailed, argo.PhaseError}}},
}

// tallies are what one setting did over every history.
type tallies struct {
	legit, stale int
	// legitDenied counts the pods of the real controller refused, by reason;
	// legitDeniedWrongly those not explained by --store-fallback=completion (goal 0).
	legitDenied        map[string]int
	legitDeniedWrongly int
	// staleStopped, by reason; staleMissedKnown is the goal-0 count: a stale pod the policy
	// covers, of a workflow that had completed in a deny phase (or was gone), admitted
	// although the live read answered.
	staleStopped     int
	staleMissedKnown map[string]int
	// windows are the stale pods admitted without a live answer, by reason: what remains.
	windows map[string]int
	// notCovered are stale pods the policy does not concern (kind or phase), admitted.
	notCovered map[string]int
	// deniedNotDue are stale pods refused although the truth at that moment did not call for
	// it (a retried workflow running again): harmless to the stale copy, counted apart.
	deniedNotDue int
	// Of the events above, the WorkflowTaskSet writes: legitimate (and refused), stale (and
	// stopped).
	taskSetLegit, taskSetLegitDenied, taskSetStale, taskSetStopped int
	// failures are the seeds of the histories that broke a goal.
	failures []uint64
}

func newTallies() *tallies {
	return &tallies{legitDenied: map[string]int{}, staleMissedKnown: map[string]int{}, windows: map[string]int{}, notCovered: map[string]int{}}
}

// simulate runs h under s and adds to t. log, when set, is told every step.
func simulate(h *history, s setting, t *tallies, log func(string, ...any)) error {
	clk := clocktesting.NewFakeClock(simT0)
	newStore := func() (*completionstore.Store, error) {
		return completionstore.New(completionstore.Options{Clock: clk})
	}
	store, err := newStore()
	if err != nil {
		return err
	}
	reader := &simReader{h: h}
	opts := s.opts
	// Live-read attempts fail at once in the simulation; a short attempt timeout keeps the
	// retries quick, and the budget is never what ends them.
	opts.LiveReadTimeout, opts.LiveReadBudget = 100*time.Microsecond, 10*time.Second
	g, err := newGuard(reader, store, opts)
	if err != nil {
		return err
	}
	wi := 0
	broke := false
	for pi, p := range h.pods {
		for wi < len(h.watch) && h.watch[wi].at <= p.at {
			a := h.watch[wi]
			wi++
			clk.SetTime(simT0.Add(a.at))
			switch {
			case a.restart:
				if store, err = newStore(); err != nil {
					return err
				}
				g.store = store
			case a.bookmark > 0:
				store.Progress(strconv.FormatInt(a.bookmark, 10))
			default:
				res := store.Observe(*a.obs)
				if res != completionstore.Invalid {
					store.Progress(a.obs.ResourceVersion)
				}
			}
			if log != nil {
				log("%9s watch %s %+v -> store", a.at, a.what, a.obs)
			}
		}
		clk.SetTime(simT0.Add(p.at))
		ctx := context.WithValue(context.Background(), planKey{}, &decisionPlan{now: p.at, plan: h.plans[pi]})
		yes := true
		meta := &metav1.ObjectMeta{Namespace: simNamespace, Name: fmt.Sprintf("pod-%d", pi),
			Labels: map[string]string{argo.LabelWorkflow: simName}, Annotations: map[string]string{},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind,
				Name: simName, UID: p.uid, Controller: &yes}}}
		switch p.kind {
		case kindExitHandler:
			meta.Labels[argo.LabelOnExit] = "true"
			meta.Annotations[argo.AnnotationNodeName] = simName + ".onExit[0].notify"
		case kindHook:
			meta.Annotations[argo.AnnotationNodeName] = simName + ".hooks.running"
		case kindAgent:
			meta.Labels[argo.LabelComponent] = argo.ComponentAgent
		default:
			meta.Annotations[argo.AnnotationNodeName] = simName + "[0].main"
		}
		var d decision
		if p.kind == kindTaskSetWrite {
			// The write the TaskSet webhook reads: a task added, the label set back by a
			// stale copy. Argo always creates the TaskSet first and patches it only on
			// AlreadyExists; the API server calls validating webhooks before it looks for an
			// existing object, so the guard judges the create, which carries the writer's
			// own owner reference, even when the name now belongs to another workflow.
			d = g.decideTaskSet(ctx, facts{object: objectTaskSet, namespace: simNamespace, name: simName,
				owner: &metav1.OwnerReference{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind, Name: simName, UID: p.uid},
				tasks: []string{fmt.Sprintf("%s-%d", simName, pi)}, reopened: p.stale})
		} else {
			_, d = g.decide(ctx, meta)
		}

		state, _, _ := h.truth(p.uid, p.at)
		due := state.deleted || oracleDenies(s.opts, state.phase)
		if p.kind == kindTaskSetWrite {
			if p.stale {
				t.taskSetStale++
				if d.deny {
					t.taskSetStopped++
				}
			} else {
				t.taskSetLegit++
				if d.deny {
					t.taskSetLegitDenied++
				}
			}
		}
		what := "legit"
		switch {
		case !p.stale:
			t.legit++
			if d.deny {
				t.legitDenied[string(d.reason)+" from "+string(d.source)]++
				what = "LEGIT DENIED"
				// The measured price of --store-fallback=completion, and nothing else.
				if s.opts.StoreFallback != FallbackCompletion || d.source != sourceStore {
					t.legitDeniedWrongly++
					broke = true
				}
			}
		case !oracleCovers(s.opts, p.kind):
			t.stale++
			t.notCovered[string(p.kind)+" pods not covered"]++
			what = "stale, not covered"
		case !due:
			t.stale++
			if d.deny {
				t.deniedNotDue++
			} else {
				t.notCovered["workflow "+phaseName(state)+" at that moment"]++
			}
			what = "stale, not due"
		default:
			t.stale++
			switch {
			case d.deny:
				t.staleStopped++
				what = "stale, stopped"
			case d.source == sourceLive:
				t.staleMissedKnown[string(d.reason)]++
				what, broke = "STALE ADMITTED ON A LIVE ANSWER", true
			case d.source != sourceStore && d.reason != reasonUnverified:
				// Not a window: the guard did not even try (the policy, as the code has it,
				// disagrees with the oracle's).
				t.staleMissedKnown[string(d.reason)]++
				what, broke = "STALE ADMITTED WITHOUT A LOOK", true
			default:
				t.windows[windowName(d, h.load)]++
				what = "stale, admitted: " + windowName(d, h.load)
			}
		}
		if log != nil {
			log("%9s pod %s of %s (stale %v): truth %s; decision deny=%v reason=%s source=%s; %s",
				p.at, p.kind, p.uid, p.stale, phaseName(state), d.deny, d.reason, d.source, what)
		}
	}
	if broke {
		t.failures = append(t.failures, h.seed)
	}
	return nil
}

// oracleCovers and oracleDenies restate the policy of a setting, apart from the code under
// test: exit handlers, agent pods and TaskSet writes that add a task are always covered, hooks
// with --cover-hooks or --strict, steps with --strict; the deny phases are the setting's,
// Succeeded by default.
func oracleCovers(o Options, k podKind) bool {
	switch k {
	case kindExitHandler, kindAgent, kindTaskSetWrite:
		return true
	case kindHook:
		return o.Hooks || o.Strict
	}
	return o.Strict
}

func oracleDenies(o Options, p argo.Phase) bool {
	if len(o.DenyPhases) == 0 {
		return p == argo.PhaseSucceeded
	}
	return slices.Contains(o.DenyPhases, p)
}

func phaseName(s wfState) string {
	switch {
	case s.deleted:
		return "deleted"
	case s.phase == "":
		return `""`
	}
	return string(s.phase)
}

// windowName names the window through which a stale pod passed.
func windowName(d decision, l loadLevel) string {
	var w string
	switch d.reason {
	case reasonUnverified:
		w = "no live answer; the store had not seen the workflow (watch lag, restart or TTL)"
	case reasonUnconfirmedCompletion:
		w = "no live answer; only the store saw the completion (--store-fallback=tombstone)"
	case reasonNotSeenCompleted:
		w = "store-first: the store had not seen the completion (watch lag)"
	case reasonWorkflowActive:
		w = "no live answer, or store-first; the store still held a running state (watch lag)"
	case reasonPhaseAllowed:
		w = "no live answer, or store-first; the store still held an earlier run's phase that is not denied (watch lag)"
	default:
		w = string(d.reason)
	}
	return w + " [" + l.name + "]"
}

func TestSimulation(t *testing.T) {
	if *simReplay >= 0 {
		h := generate(uint64(*simReplay))
		t.Logf("history %d, load %s: %d writes, %d pods, %d watch actions", h.seed, h.load.name, len(h.writes), len(h.pods), len(h.watch))
		for _, w := range h.writes {
			t.Logf("%9s truth %s rv %d phase %s deleted %v", w.at, w.state.uid, w.state.rv, phaseName(w.state), w.state.deleted)
		}
		for _, s := range simSettings {
			t.Logf("== %s", s.name)
			ts := newTallies()
			if err := simulate(h, s, ts, t.Logf); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	results := make([]*tallies, len(simSettings))
	for i := range results {
		results[i] = newTallies()
	}
	loads := map[string]int{}
	start := time.Now()
	for i := range *simHistories {
		h := generate(*simSeed + uint64(i))
		loads[h.load.name]++
		for si, s := range simSettings {
			if err := simulate(h, s, results[si], nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	report := simulationReport(*simHistories, *simSeed, loads, results, time.Since(start))
	t.Log("\n" + report)
	if *simReport != "" {
		if err := os.WriteFile(*simReport, []byte(report), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for si, s := range simSettings {
		r := results[si]
		if len(r.staleMissedKnown) > 0 {
			t.Errorf("%s: stale pods admitted although the live read answered, or without a look: %v; replay with -sim.replay=%d", s.name, r.staleMissedKnown, r.failures[0])
		}
		if r.legitDeniedWrongly > 0 {
			t.Errorf("%s: %d legitimate pods denied: %v; replay with -sim.replay=%d", s.name, r.legitDeniedWrongly, r.legitDenied, r.failures[0])
		}
		if r.legit == 0 || r.stale == 0 {
			t.Errorf("%s: %d legitimate and %d stale pods: the simulation made nothing to judge", s.name, r.legit, r.stale)
		}
	}
}

func simulationReport(n int, seed uint64, loads map[string]int, results []*tallies, took time.Duration) string {
	var b strings.Builder
	b.WriteString("# The simulation at length\n\nWritten by `make soak` (`go test ./webhook -run TestSimulation -args -sim.histories=N -sim.report=FILE`);\n" +
		"docs/reliability.md says what it models and what the figures mean.\n\n")
	fmt.Fprintf(&b, "%d histories from seed %d (load: %d idle, %d loaded, %d overloaded), %s\n\n",
		n, seed, loads["idle"], loads["loaded"], loads["overloaded"], took.Round(time.Second))
	b.WriteString("Pods and WorkflowTaskSet writes that add a task are counted together; each setting's lines below give the TaskSet writes apart.\n\n")
	b.WriteString("| setting | legitimate pods and writes | denied (goal 0) | stale ones | stopped | admitted on a live answer (goal 0) | admitted in a window | not covered by the setting |\n|---|---|---|---|---|---|---|---|\n")
	sum := func(m map[string]int) int {
		s := 0
		for _, v := range m {
			s += v
		}
		return s
	}
	for i, s := range simSettings {
		r := results[i]
		fmt.Fprintf(&b, "| `%s` | %d | %d | %d | %d | %d | %d | %d |\n", s.name, r.legit, sum(r.legitDenied), r.stale,
			r.staleStopped, sum(r.staleMissedKnown), sum(r.windows), sum(r.notCovered))
	}
	for i, s := range simSettings {
		r := results[i]
		fmt.Fprintf(&b, "\n`%s`:\n", s.name)
		fmt.Fprintf(&b, "- WorkflowTaskSet writes: %d legitimate (%d denied), %d stale (%d stopped)\n",
			r.taskSetLegit, r.taskSetLegitDenied, r.taskSetStale, r.taskSetStopped)
		due := r.staleStopped + sum(r.windows) + sum(r.staleMissedKnown)
		for _, k := range sortedKeys(r.windows) {
			fmt.Fprintf(&b, "- window: %s: %d stale pods or writes (%.3f%% of the %d the setting should stop)\n", k, r.windows[k], 100*float64(r.windows[k])/float64(max(due, 1)), due)
		}
		for _, k := range sortedKeys(r.legitDenied) {
			fmt.Fprintf(&b, "- legitimate pods denied: %s: %d (%.3f%% of %d)\n", k, r.legitDenied[k], 100*float64(r.legitDenied[k])/float64(max(r.legit, 1)), r.legit)
		}
		for _, k := range sortedKeys(r.notCovered) {
			fmt.Fprintf(&b, "- admitted by policy: %s: %d\n", k, r.notCovered[k])
		}
		if r.deniedNotDue > 0 {
			fmt.Fprintf(&b, "- stale pods denied while their workflow ran again (harmless): %d\n", r.deniedNotDue)
		}
	}
	return b.String()
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// planReader fails the live-read attempts its plan says, and reads through otherwise.
type planReader struct {
	client.Reader
	mu     sync.Mutex
	plan   []bool
	called int
}

// List is the first read of each live-read attempt (readWorkflow): failing it fails the attempt.
func (p *planReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	p.mu.Lock()
	k := p.called
	p.called++
	fail := k >= len(p.plan) || p.plan[k]
	p.mu.Unlock()
	if fail {
		return apierrors.NewServiceUnavailable("simulated: the API server cannot answer")
	}
	return p.Reader.List(ctx, list, opts...)
}

func (p *planReader) setPlan(plan []bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.plan, p.called = plan, 0
}

// TestSimulationThroughTheAPIServer runs a sample of the simulation's histories end to end: the
// writes are made on the real API server, the guard (with its real watch) is called by the API
// server for each pod, and the oracle judges the answers. Time is compressed: every step runs
// as soon as the one before it is done, so the watch lags as little as it does.
func TestSimulationThroughTheAPIServer(t *testing.T) {
	const histories = 40
	for _, s := range []setting{simSettings[0], simSettings[2]} {
		t.Run(s.name, func(t *testing.T) {
			reader := &planReader{}
			opts := s.opts
			// No hedges (an attempt may take its whole budget), so that no attempt of one
			// pod's decision can start after the next pod's plan is set.
			opts.LiveReadTimeout, opts.LiveReadBudget = 1500*time.Millisecond, 1500*time.Millisecond
			h := startGuard(t, opts, harnessOptions{reader: reader})
			reader.Reader = h.client
			var legit, stale, stopped, judged int
			for i := range histories {
				hist := generate(*simSeed + uint64(i))
				ns := newNamespace(t)
				objs := map[types.UID]*unstructured.Unstructured{}
				wi := 0
				for pi, p := range hist.pods {
					for ; wi < len(hist.writes) && hist.writes[wi].at <= p.at; wi++ {
						applyWrite(t, ns, objs, hist.writes[wi].state)
						// The store-first decisions of --strict read the store: let the
						// watch deliver first (the in-process simulation has the lag).
						st, wf := hist.writes[wi].state, objs[hist.writes[wi].state.uid]
						waitRecord(t, h.store, wf, "the write", func(r completionstore.Record) bool {
							return r.Deleted == st.deleted && (st.deleted || r.ResourceVersion == wf.GetResourceVersion())
						})
					}
					// At most three failed attempts before an answer (about 350 ms of
					// retries, well inside the budget), or none answering at all: so that
					// "the live read could answer" holds however slow this machine is.
					plan := slices.Clone(hist.plans[pi])
					if slices.Contains(plan, false) {
						for k := 3; k < len(plan); k++ {
							plan[k] = false
						}
					}
					reader.setPlan(plan)
					wf := objs[p.uid]
					pod := argoPod(wf, fmt.Sprintf("pod-%d", pi), simName+"[0].main", false)
					switch p.kind {
					case kindExitHandler:
						pod = argoPod(wf, fmt.Sprintf("pod-%d", pi), simName+".onExit[0].notify", true)
					case kindHook:
						pod = argoPod(wf, fmt.Sprintf("pod-%d", pi), simName+".hooks.running", false)
					case kindAgent:
						pod = agentPod(wf)
						pod.Name = fmt.Sprintf("pod-%d", pi)
					}
					var obj client.Object = pod
					if p.kind == kindTaskSetWrite {
						// The TaskSet created with a task (what a stale copy sends when the
						// workflow had no TaskSet, and is judged as a patch that adds one).
						key, tmpl := onExitTask(wf)
						obj = taskSetOf(wf, map[string]any{key: tmpl})
					}
					err := env.Client.Create(t.Context(), obj, client.DryRunAll)
					denied := apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exit-guard refused")
					if err != nil && !denied {
						t.Fatalf("seed %d pod %d: %v", hist.seed, pi, err)
					}
					state, _, _ := hist.truth(p.uid, p.at)
					due := state.deleted || oracleDenies(s.opts, state.phase)
					answered := slices.Contains(plan, false)
					switch {
					case !p.stale:
						legit++
						if denied {
							t.Errorf("seed %d pod %d: a legitimate %s pod (workflow %s) was denied: %v", hist.seed, pi, p.kind, phaseName(state), err)
						}
					case oracleCovers(s.opts, p.kind) && due && answered:
						stale++
						judged++
						if !denied {
							t.Errorf("seed %d pod %d: a stale %s pod of a workflow %s was admitted although the live read could answer", hist.seed, pi, p.kind, phaseName(state))
						}
						stopped++
					default:
						stale++
					}
				}
			}
			t.Logf("%d histories through the API server: %d legitimate pods and TaskSet writes, %d stale ones, %d of them due and answerable, all refused: %v",
				histories, legit, stale, judged, judged == stopped)
			if legit == 0 || judged == 0 {
				t.Errorf("the sample made %d legitimate pods and %d stale pods to judge: nothing to check", legit, judged)
			}
		})
	}
}

// applyWrite makes one write of the truth on the API server, as Argo's controller (or argo
// retry, or the TTL controller) would.
func applyWrite(t *testing.T, ns string, objs map[types.UID]*unstructured.Unstructured, s wfState) {
	t.Helper()
	wf, ok := objs[s.uid]
	switch {
	case !ok:
		objs[s.uid] = createWorkflow(t, ns, simName, s.phase)
	case s.deleted:
		if err := env.Client.Delete(t.Context(), wf); err != nil {
			t.Fatal(err)
		}
	default:
		if !s.phase.Terminal() {
			// argo retry removes the completed label; setPhase writes it back as false.
			labels := wf.GetLabels()
			delete(labels, "workflows.argoproj.io/completed")
			wf.SetLabels(labels)
		}
		setPhase(t, wf, s.phase)
	}
}
