package webhook

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

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
	if wf, ok := obj.(*argo.WorkflowNodes); ok {
		// The whole read of row T6: the holder's node of the task, once it has written it.
		p, _ := ctx.Value(planKey{}).(*decisionPlan)
		wf.Namespace, wf.Name, wf.UID = key.Namespace, key.Name, holder.uid
		wf.Status.Phase = holder.phase
		wf.Status.Nodes = map[string]argo.Node{}
		if p != nil && p.nodeWritten {
			wf.Status.Nodes[p.task] = argo.Node{Name: p.node, Type: argo.NodeTypeHTTP, Phase: "Pending"}
		}
		return nil
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
	{"--store-fallback=fresh", Options{StoreFallback: FallbackFresh}},
	{"--store-fallback=fresh --store-fresh-for=15s", Options{StoreFallback: FallbackFresh, StoreFreshFor: 15 * time.Second}},
	{"--store-fallback=tombstone", Options{StoreFallback: FallbackTombstone}},
	{"--store-fallback=completion", Options{StoreFallback: FallbackCompletion}},
	{"--store-first", Options{StoreFirst: true}},
	{"--strict", Options{Strict: true}},
	{"--cover-hooks", Options{Hooks: true}},
	{"--deny-phases=Succeeded,Failed,Error", Options{DenyPhases: []argo.Phase{argo.PhaseSucceeded, argo.PhaseFailed, argo.PhaseError}}},
}

// tallies are what one setting did over every history.
type tallies struct {
	legit, stale int
	// legitDenied counts the refusals of the real controller's pods and writes, by reason
	// (every pass); legitDeniedWrongly those that are neither a store fallback's refusal of
	// a completion (the price: the object waits for Argo's next pass) nor refused by design
	// (goal 0).
	legitDenied        map[string]int
	legitDeniedWrongly int
	// delayed are the legitimate pods and writes refused at least once and admitted later,
	// and delays how long each waited from its first try; lost those never admitted (an
	// agent pod on v3.4, or past simHorizon), by kind and line (goal 0).
	delayed    int
	delays     []time.Duration
	lost       map[string]int
	priceSeeds []uint64 // the seeds of the histories where one was delayed or lost
	// byDesign are the TaskSet writes of a workflow that reused the name, refused while the
	// deleted workflow's TaskSet waited for the garbage collector (taskset-owner-gone), and
	// byDesignDelay the time they waited in all.
	byDesign      int
	byDesignDelay time.Duration
	// byDesignStalled are such writes refused on a later pass too (the node already in the
	// status, no live answer): Argo writes again only when something wakes the workflow.
	byDesignStalled int
	// byDesignStalledSteps: those of a step's task (row T6 admits them from the status).
	byDesignStalledSteps int
	// staleStopped: stale pods and writes due a refusal refused on every pass their copy made;
	// staleRefusals the refusals of stale ones in all (every pass), staleRepeats those past a
	// copy's first pass. staleMissedKnown is the goal-0 count: a due stale one admitted
	// although the live read answered.
	staleStopped, staleRefusals, staleRepeats int
	staleMissedKnown                          map[string]int
	// windows are the due stale ones admitted without a live answer, by reason (on any pass).
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
	return &tallies{legitDenied: map[string]int{}, lost: map[string]int{}, staleMissedKnown: map[string]int{},
		windows: map[string]int{}, notCovered: map[string]int{}}
}

// try is one pass of a pod or write: the first, or Argo's next pass after a refusal.
type try struct {
	at   time.Duration
	pi   int // index in h.pods
	pass int
}

// planFor is the live-read plan of pass pass of pod pi at the moment at: the history's own for
// the first pass (TestSimulationThroughTheAPIServer uses it too), drawn for the later ones.
func planFor(h *history, pi, pass int, at time.Duration) []bool {
	if pass == 0 {
		return h.plans[pi]
	}
	r := rand.New(rand.NewPCG(h.seed, uint64(pi)<<16|uint64(pass)))
	plan := make([]bool, maxLiveReadAttempts)
	outage := h.cut(at) || r.Float64() < h.load.outage
	for k := range plan {
		plan[k] = outage || r.Float64() < h.load.attemptFail
	}
	return plan
}

// nextTry is when Argo's controller sends a refused legitimate object again, and whether it
// does: a node's pod on its next pass (the requeue); an agent pod so on 3.6 and later, never
// on v3.4 (the workflow is Error); a TaskSet write on the pass its own status write wakes, then
// only at the resync.
func nextTry(h *history, p podEvent, tr try) (time.Duration, bool) {
	switch p.kind {
	case roleAgent:
		if h.line == lineV34 {
			return 0, false
		}
	case roleTaskWrite:
		if tr.pass > 0 {
			return tr.at + simResync, true
		}
	}
	return tr.at + *simRequeue, true
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
	// Row T7's memory on the virtual clock: on the real one, every create would repeat one
	// admitted milliseconds before.
	g.creates = newTaskSetCreates(clk.Now, g.opts.TaskSetRepeatsFor)
	// The tries in time order: every pod's first, and the passes after a refusal.
	queue := make([]try, 0, len(h.pods))
	for pi, p := range h.pods {
		queue = append(queue, try{at: p.at, pi: pi})
	}
	push := func(tr try) {
		i, _ := slices.BinarySearchFunc(queue, tr.at, func(a try, at time.Duration) int {
			if a.at <= at {
				return -1 // after every try of the same moment
			}
			return 1
		})
		queue = slices.Insert(queue, i, tr)
	}
	wi := 0
	broke := false
	for len(queue) > 0 {
		tr := queue[0]
		queue = queue[1:]
		pi, p := tr.pi, h.pods[tr.pi]
		for wi < len(h.watch) && h.watch[wi].at <= tr.at {
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
			if a.sampled {
				store.NoteLag(a.lag)
			}
			if log != nil {
				log("%9s watch %s %+v -> store", a.at, a.what, a.obs)
			}
		}
		clk.SetTime(simT0.Add(tr.at))
		dp := &decisionPlan{now: tr.at, truthAt: tr.at, plan: planFor(h, pi, tr.pass, tr.at)}
		if !p.stale && tr.pass > 0 && h.movedOn(p.uid, p.at, tr.at) {
			dp.truthAt = p.at
		}
		ctx := context.WithValue(context.Background(), planKey{}, dp)
		d := decideSim(ctx, g, dp, p, pi, tr.pass)

		state, _, _ := h.truth(p.uid, tr.at)
		due := state.deleted || oracleDenies(s.opts, state.phase)
		what := "legit"
		final := true // the pod's last pass: count it
		switch {
		case !p.stale && d.deny && p.gcOwner != "" && d.reason == contract.ReasonTaskSetOwnerGone && p.firstPass:
			// By design (docs/decisions.md, row T5): judged without its create, the node not
			// in the status yet; Argo's next pass writes again (an event of its own).
			t.byDesign++
			t.byDesignDelay += p.nextPass - p.at
			what = "legit, refused by design (taskset-owner-gone, first pass)"
		case !p.stale && d.deny && p.gcOwner != "" && d.reason == contract.ReasonTaskSetOwnerGone:
			// A later pass refused too (its create judged elsewhere and an exit handler's
			// task, or no live answer): Argo writes again only when something wakes the
			// workflow, at worst its resync.
			t.byDesignStalled++
			if !p.inExitHandler {
				t.byDesignStalledSteps++
			}
			what = "legit, refused by design on a later pass (taskset-owner-gone): waits for a wake-up"
		case !p.stale && d.deny:
			t.legitDenied[string(d.reason)+" from "+string(d.source)]++
			if d.source == sourceStore && (d.reason == contract.ReasonWorkflowCompleted || d.reason == contract.ReasonWorkflowSucceeded) {
				// The price of a store fallback that refuses from a completion: a retry the
				// watch had not delivered, with no live answer. Argo sends it again.
				what = "legit refused (the store fallback's price)"
			} else {
				t.legitDeniedWrongly++
				what, broke = "LEGIT DENIED", true
			}
			if next, ok := nextTry(h, p, tr); ok && next-p.at <= simHorizon {
				push(try{at: next, pi: pi, pass: tr.pass + 1})
				final = false
				what += fmt.Sprintf("; tried again at %s", next)
			} else {
				t.lost[string(p.kind)+" on "+h.line]++
				t.priceSeeds = append(t.priceSeeds, h.seed)
				what += "; LOST"
			}
		case !p.stale:
			if tr.pass > 0 {
				t.delayed++
				t.delays = append(t.delays, tr.at-p.at)
				t.priceSeeds = append(t.priceSeeds, h.seed)
				what = fmt.Sprintf("legit, admitted %s late", tr.at-p.at)
			}
		case d.deny:
			t.staleRefusals++
			if tr.pass > 0 {
				t.staleRepeats++
			}
			if next := tr.at + *simRequeue; next-p.at <= p.heldFor {
				// Argo's informer still holds the stale copy: it tries again.
				push(try{at: next, pi: pi, pass: tr.pass + 1})
				final = false
				what = "stale, refused; tried again"
			}
		}
		if final {
			tallyFinal(t, s, h, p, d, due, state, &what, &broke)
		}
		if log != nil {
			log("%9s pod %s of %s (stale %v, pass %d): truth %s; decision deny=%v reason=%s source=%s; %s",
				tr.at, p.kind, p.uid, p.stale, tr.pass, phaseName(state), d.deny, d.reason, d.source, what)
		}
	}
	if broke {
		t.failures = append(t.failures, h.seed)
	}
	return nil
}

// tallyFinal counts a pod or write at its last pass, with that pass's decision d.
func tallyFinal(t *tallies, s setting, h *history, p podEvent, d decision, due bool, state wfState, what *string, broke *bool) {
	if p.kind == roleTaskWrite {
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
	switch {
	case !p.stale:
		t.legit++
	case !oracleCovers(s.opts, p.kind):
		t.stale++
		t.notCovered[string(p.kind)+" pods not covered"]++
		*what = "stale, not covered"
	case !due:
		t.stale++
		if d.deny {
			t.deniedNotDue++
		} else {
			t.notCovered["workflow "+phaseName(state)+" at that moment"]++
		}
		*what = "stale, not due"
	default:
		t.stale++
		switch {
		case d.deny:
			t.staleStopped++
			*what = "stale, stopped"
		case d.source == sourceLive:
			t.staleMissedKnown[string(d.reason)]++
			*what, *broke = "STALE ADMITTED ON A LIVE ANSWER", true
		case d.source != sourceStore && d.reason != contract.ReasonUnverifiedFailOpen:
			// Not a window: the guard did not even try (the policy, as the code has it,
			// disagrees with the oracle's).
			t.staleMissedKnown[string(d.reason)]++
			*what, *broke = "STALE ADMITTED WITHOUT A LOOK", true
		default:
			t.windows[windowName(d, h.load)]++
			*what = "stale, admitted: " + windowName(d, h.load)
		}
	}
}

// decideSim judges pass pass of pod event p (index pi) with the guard g.
func decideSim(ctx context.Context, g *guard, dp *decisionPlan, p podEvent, pi, pass int) decision {
	meta := &metav1.ObjectMeta{Namespace: simNamespace, Name: fmt.Sprintf("pod-%d", pi),
		Labels: map[string]string{argo.LabelWorkflow: simName}, Annotations: map[string]string{},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind,
			Name: simName, UID: p.uid, Controller: ptr.To(true)}}}
	switch p.kind {
	case roleExitHandler:
		meta.Labels[argo.LabelOnExit] = "true"
		meta.Annotations[argo.AnnotationNodeName] = simName + ".onExit[0].notify"
	case roleHook:
		meta.Annotations[argo.AnnotationNodeName] = simName + ".hooks.running"
	case roleAgent:
		meta.Labels[argo.LabelComponent] = argo.ComponentAgent
	default:
		meta.Annotations[argo.AnnotationNodeName] = simName + "[0].main"
	}
	if p.kind != roleTaskWrite {
		return g.decide(ctx, classify(meta))
	}
	// The write the TaskSet webhook reads: a task added, the label set back by a stale copy.
	// Argo always creates the TaskSet first and patches it only on AlreadyExists; the API
	// server calls validating webhooks before it looks for an existing object, so the guard
	// judges the create, which carries the writer's own owner reference, even when the name
	// now belongs to another workflow. The create of a workflow that reused the name, while
	// the old TaskSet is still there, is admitted and fails with AlreadyExists: the guard then
	// judges the patch, an update of the old object, which keeps the old owner.
	task := fmt.Sprintf("%s-%d", simName, pi)
	if p.exitTask {
		task = argo.NodeID(simName, argo.OnExitNodeName(simName))
	}
	owner := p.uid
	if p.gcOwner != "" {
		owner = p.gcOwner
	}
	node := simName + "[0].call"
	if p.inExitHandler {
		node = simName + ".onExit[0].notify"
	}
	// A later pass has the node in the writer's status.
	dp.task, dp.node, dp.nodeWritten = task, node, !p.firstPass || pass > 0
	templates := map[string][sha256.Size]byte{task: sha256.Sum256([]byte("template of " + task + " by " + string(p.uid)))}
	if p.gcOwner != "" && p.sameReplica {
		// Argo's create, judged by this replica before the patch: it names the writer.
		g.decide(ctx, facts{namespace: simNamespace, role: roleTaskWrite, startsWork: true,
			owner: &metav1.OwnerReference{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind, Name: simName, UID: p.uid},
			object: &taskSetObject{namespace: simNamespace, name: simName, workflow: simName,
				tasks: []string{task}, templates: templates, reopened: p.stale}})
	}
	return g.decide(ctx, facts{namespace: simNamespace, role: roleTaskWrite, startsWork: true, update: p.gcOwner != "",
		owner: &metav1.OwnerReference{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind, Name: simName, UID: owner},
		object: &taskSetObject{namespace: simNamespace, name: simName, workflow: simName,
			tasks: []string{task}, templates: templates, reopened: p.stale}})
}

// oracleCovers and oracleDenies restate the policy of a setting, apart from the code under
// test: exit handlers, agent pods and TaskSet writes that add a task are always covered, hooks
// with --cover-hooks or --strict, steps with --strict; the deny phases are the setting's,
// Succeeded by default.
func oracleCovers(o Options, k role) bool {
	switch k {
	case roleExitHandler, roleAgent, roleTaskWrite:
		return true
	case roleHook:
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
	case contract.ReasonUnverifiedFailOpen:
		w = "no live answer; the store had not seen the workflow (watch lag, restart or TTL)"
	case contract.ReasonUnconfirmedCompletion:
		w = "no live answer; only the store saw the completion, which the fallback may not refuse (tombstone, or the watch quiet past --store-fresh-for)"
	case contract.ReasonNotSeenCompleted:
		w = "store-first: the store had not seen the completion (watch lag)"
	case contract.ReasonWorkflowNotTerminal:
		w = "no live answer, or store-first; the store still held a running state (watch lag)"
	case contract.ReasonPhaseNotDenied:
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
	levels := loadLevelNames()
	// results[setting][level]
	results := make([][]*tallies, len(simSettings))
	for i := range results {
		for range levels {
			results[i] = append(results[i], newTallies())
		}
	}
	loads := map[string]int{}
	start := time.Now()
	histories := *simHistories
	if testing.Short() && !flagSet("sim.histories") {
		// The unit tier (make test-unit): a tenth of the histories, the same checks.
		histories /= 10
		t.Logf("-short: %d histories (make test runs %d)", histories, *simHistories)
	}
	for i := range histories {
		h := generate(*simSeed + uint64(i))
		loads[h.load.name]++
		li := slices.Index(levels, h.load.name)
		for si, s := range simSettings {
			if err := simulate(h, s, results[si][li], nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	report := simulationReport(histories, *simSeed, loads, results, time.Since(start))
	t.Log("\n" + report)
	if *simReport != "" {
		if err := os.WriteFile(*simReport, []byte(report), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for si, s := range simSettings {
		r := total(results[si])
		if len(r.staleMissedKnown) > 0 {
			t.Errorf("%s: stale pods admitted although the live read answered, or without a look: %v; replay with -sim.replay=%d", s.name, r.staleMissedKnown, r.failures[0])
		}
		if r.legitDeniedWrongly > 0 {
			t.Errorf("%s: %d legitimate pods denied: %v; replay with -sim.replay=%d", s.name, r.legitDeniedWrongly, r.legitDenied, r.failures[0])
		}
		if s.name == "default" && sum(r.lost) > 0 {
			// The default's promise: a refusal of the store fallback costs a legitimate pod
			// Argo's next pass, never its notice. The other settings' losses are measured.
			t.Errorf("default: %d legitimate pods or writes lost: %v; replay with -sim.replay=%d", sum(r.lost), r.lost, r.priceSeeds[0])
		}
		if r.legit == 0 || r.stale == 0 {
			t.Errorf("%s: %d legitimate and %d stale pods: the simulation made nothing to judge", s.name, r.legit, r.stale)
		}
	}
	// The worlds must make what the report measures, or its figures say nothing.
	if d := total(results[0]); d.byDesign == 0 || d.taskSetLegit == 0 {
		t.Errorf("no TaskSet write of a workflow that reused the name met the old TaskSet (%d refused by design): the world lacks the case", d.byDesign)
	}
	if d := total(results[0]); d.staleRepeats == 0 {
		t.Errorf("no stale copy came back after a refusal (%d refusals): the world lacks Argo's requeue", d.staleRefusals)
	}
	for li, l := range levels {
		if r := results[0][li]; l == levels[0] && r.byDesignStalledSteps != 0 {
			// Idle, every live read answers: row T6 admits each later pass of a step's task
			// from the status (an exit handler's only from its create).
			t.Errorf("%s: %d later-pass TaskSet writes of a step of a workflow that reused the name refused (row T6 should admit them)", l, r.byDesignStalledSteps)
		}
		if r := results[0][li]; r.staleStopped == 0 {
			t.Errorf("level %q: no stale pod stopped by the default: the level makes nothing to judge", l)
		}
	}
}

// total sums one setting's tallies over the load levels.
func total(per []*tallies) *tallies {
	out := newTallies()
	add := func(dst, src map[string]int) {
		for k, v := range src {
			dst[k] += v
		}
	}
	for _, r := range per {
		out.legit += r.legit
		out.stale += r.stale
		add(out.legitDenied, r.legitDenied)
		out.legitDeniedWrongly += r.legitDeniedWrongly
		out.delayed += r.delayed
		out.delays = append(out.delays, r.delays...)
		add(out.lost, r.lost)
		out.priceSeeds = append(out.priceSeeds, r.priceSeeds...)
		out.byDesign += r.byDesign
		out.byDesignDelay += r.byDesignDelay
		out.byDesignStalled += r.byDesignStalled
		out.staleStopped += r.staleStopped
		out.staleRefusals += r.staleRefusals
		out.staleRepeats += r.staleRepeats
		add(out.staleMissedKnown, r.staleMissedKnown)
		add(out.windows, r.windows)
		add(out.notCovered, r.notCovered)
		out.deniedNotDue += r.deniedNotDue
		out.taskSetLegit += r.taskSetLegit
		out.taskSetLegitDenied += r.taskSetLegitDenied
		out.taskSetStale += r.taskSetStale
		out.taskSetStopped += r.taskSetStopped
		out.failures = append(out.failures, r.failures...)
	}
	return out
}

func sum(m map[string]int) int {
	s := 0
	for _, v := range m {
		s += v
	}
	return s
}

func pct(n, of int) string { return fmt.Sprintf("%.3f%%", 100*float64(n)/float64(max(of, 1))) }

func simulationReport(n int, seed uint64, loads map[string]int, results [][]*tallies, took time.Duration) string {
	var b strings.Builder
	levels := loadLevelNames()
	b.WriteString("# The simulation at length\n\nWritten by `make soak` (`go test ./webhook -run TestSimulation -args -sim.histories=N -sim.report=FILE`);\n" +
		"docs/evidence/reliability.md says what it models and what the figures mean.\n\n")
	fmt.Fprintf(&b, "%d histories from seed %d, %s; Argo's requeue %s; Succeeded runs retried (--restart-successful, 3.6+): %.1f%%. Load levels:",
		n, seed, took.Round(time.Second), *simRequeue, 100**simSucceededRetries)
	for i, l := range levels {
		sep := ","
		if i == len(levels)-1 {
			sep = "."
		}
		fmt.Fprintf(&b, " %s %d%s", l, loads[l], sep)
	}
	b.WriteString("\n\nPods and WorkflowTaskSet writes that add a task are counted together, once each however many passes tried them; each setting's lines below give the TaskSet writes apart. " +
		"\"Due\" stale ones are those the setting covers, of a workflow completed in a deny phase (or deleted) at that moment; \"stopped\" ones were refused on every pass their copy made. " +
		"Delays run from a legitimate one's first try to the pass that was admitted; lost ones were never admitted.\n\n")
	b.WriteString("| setting | legitimate | delayed | delay p50 / p99 / max | lost (goal 0) | refused with a live answer (goal 0) | refused by design (T5): first pass, later pass | stale | due | stopped | refusals of stale ones: all, past a copy's first pass | admitted on a live answer (goal 0) | admitted in a window |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, s := range simSettings {
		r := total(results[i])
		due := r.staleStopped + sum(r.windows) + sum(r.staleMissedKnown)
		fmt.Fprintf(&b, "| `%s` | %d | %d | %s | %d | %d | %d, %d | %d | %d | %d | %d, %d | %d | %d (%s) |\n", s.name, r.legit, r.delayed, delayFigures(r.delays), sum(r.lost),
			r.legitDeniedWrongly, r.byDesign, r.byDesignStalled, r.stale, due, r.staleStopped, r.staleRefusals, r.staleRepeats, sum(r.staleMissedKnown), sum(r.windows), pct(sum(r.windows), due))
	}
	b.WriteString("\n## Per load level\n\nStale ones admitted in a window, of those due; legitimate ones delayed (and lost), of the legitimate.\n\n| setting |")
	for _, l := range levels {
		fmt.Fprintf(&b, " %s: windows | %s: delayed (lost) |", l, l)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|---|", len(levels)) + "\n")
	for i, s := range simSettings {
		fmt.Fprintf(&b, "| `%s` |", s.name)
		for li := range levels {
			r := results[i][li]
			due := r.staleStopped + sum(r.windows) + sum(r.staleMissedKnown)
			fmt.Fprintf(&b, " %d of %d (%s) | %d (%d) of %d |", sum(r.windows), due, pct(sum(r.windows), due), r.delayed, sum(r.lost), r.legit)
		}
		b.WriteString("\n")
	}
	for i, s := range simSettings {
		r := total(results[i])
		fmt.Fprintf(&b, "\n`%s`:\n", s.name)
		fmt.Fprintf(&b, "- WorkflowTaskSet writes: %d legitimate (%d refused, %d of them by design), %d stale (%d stopped)\n",
			r.taskSetLegit, r.taskSetLegitDenied, r.byDesign, r.taskSetStale, r.taskSetStopped)
		if r.byDesign > 0 {
			fmt.Fprintf(&b, "- refused by design: %d first-pass writes of a workflow that reused the name, judged without their create, written again %s later on average (the next pass, or the collector's deletion where the workflow completed first); %d refused on a later pass too (another replica's create and an exit handler's task, or no live answer), waiting for a wake-up\n",
				r.byDesign, (r.byDesignDelay / time.Duration(r.byDesign)).Round(100*time.Millisecond), r.byDesignStalled)
		}
		due := r.staleStopped + sum(r.windows) + sum(r.staleMissedKnown)
		for _, k := range sortedKeys(r.windows) {
			fmt.Fprintf(&b, "- window: %s: %d stale pods or writes (%s of the %d the setting should stop)\n", k, r.windows[k], pct(r.windows[k], due), due)
		}
		for _, k := range sortedKeys(r.legitDenied) {
			fmt.Fprintf(&b, "- refusals of legitimate pods and writes (every pass): %s: %d\n", k, r.legitDenied[k])
		}
		for _, k := range sortedKeys(r.lost) {
			fmt.Fprintf(&b, "- lost: %s pods or writes: %d\n", k, r.lost[k])
		}
		if len(r.priceSeeds) > 0 {
			slices.Sort(r.priceSeeds)
			seeds := slices.Compact(r.priceSeeds)
			fmt.Fprintf(&b, "- delays and losses came in the histories of seeds %v (`-sim.replay=N`)\n", seeds[:min(len(seeds), 10)])
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

func sortedKeys(m map[string]int) []string { return slices.Sorted(maps.Keys(m)) }

// delayFigures is "p50 / p99 / max" of ds, or "-" when there are none.
func delayFigures(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	ds = slices.Sorted(slices.Values(ds))
	q := func(f float64) time.Duration {
		return ds[min(len(ds)-1, int(f*float64(len(ds))))].Round(100 * time.Millisecond)
	}
	return fmt.Sprintf("%s / %s / %s", q(.5), q(.99), ds[len(ds)-1].Round(100*time.Millisecond))
}

// flagSet says whether the flag name was set on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// settingNamed is the simulated setting of that name.
func settingNamed(t *testing.T, name string) setting {
	t.Helper()
	for _, s := range simSettings {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("no simulated setting %q", name)
	return setting{}
}
