package webhook

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// setting is a policy the simulation measures. A comparison is not one the guard ships, only
// weighed against them: its goal columns (lost, refused with a live answer, admitted on a live
// answer) are reported as measured, not asserted.
type setting struct {
	name       string
	opts       Options
	comparison bool
}

var simSettings = []setting{
	{"default", Options{}, false},
	{"--store-fallback=fresh", Options{StoreFallback: FallbackFresh}, false},
	{"--store-fallback=fresh --store-fresh-for=15s", Options{StoreFallback: FallbackFresh, StoreFreshFor: 15 * time.Second}, false},
	{"--store-fallback=tombstone", Options{StoreFallback: FallbackTombstone}, false},
	{"--store-fallback=completion", Options{StoreFallback: FallbackCompletion}, false},
	{"--store-first", Options{StoreFirst: true}, false},
	{"--cover=exit-handlers,steps", Options{Cover: Coverage{NoHooks: true}}, false},
	{"--cover=exit-handlers", Options{Cover: Coverage{NoHooks: true, NoSteps: true}}, false},
	{"--deny-phases=Succeeded,Failed,Error", Options{DenyPhases: []argo.Phase{argo.PhaseSucceeded, argo.PhaseFailed, argo.PhaseError}}, false},
	// Exit handlers, agent pods and TaskSet writes read within the hooks' and steps' 750 ms
	// instead of 4 s: what the longer budget buys.
	{"--live-read-budget=750ms", Options{LiveReadBudget: 750 * time.Millisecond, LiveReadTimeout: 250 * time.Millisecond}, true},
}

// try is one pass of a pod or write: the first, or Argo's next pass after a refusal.
type try struct {
	at   time.Duration
	pi   int // index in h.pods
	pass int
}

// planFor is the live-read plan of pass pass of pod pi at the moment at: the history's own for
// the first pass (TestSimulationThroughTheAPIServer uses it too), drawn for the later ones. A
// decision read within the short budget (short: 750 ms) also fails whole with the level's
// outageShort, drawn apart, so that every setting meets the same histories and a decision
// without an answer within 4 s has none within 750 ms either.
func planFor(h *history, pi, pass int, at time.Duration, short bool) []bool {
	var plan []bool
	if pass == 0 {
		plan = h.plans[pi]
	} else {
		r := rand.New(rand.NewPCG(h.seed, uint64(pi)<<16|uint64(pass)))
		plan = make([]bool, maxLiveReadAttempts)
		outage := h.cut(at) || r.Float64() < h.load.outage
		for k := range plan {
			plan[k] = outage || r.Float64() < h.load.attemptFail
		}
	}
	if short && h.load.outageShort > 0 {
		r := rand.New(rand.NewPCG(h.seed^0x5bd1e995, uint64(pi)<<16|uint64(pass)))
		if r.Float64() < h.load.outageShort {
			plan = slices.Repeat([]bool{true}, maxLiveReadAttempts)
		}
	}
	return plan
}

// shortRead says whether s reads the workflow of a pod or write of role k within 750 ms, the
// default --hook-step-read-budget: hook and step pods always, the others (exit-handler and
// agent pods, TaskSet writes) when s sets --live-read-budget that short.
func (s setting) shortRead(k role) bool {
	if k == roleHook || k == roleStep {
		return true
	}
	return s.opts.LiveReadBudget > 0 && s.opts.LiveReadBudget <= DefaultOptions().HookStepReadBudget
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

// deletedWhileWaiting: a legitimate pod of the workflow the model deletes was refused, and
// Argo would send it again only at until, after the deletion: the model must hold the deletion.
type deletedWhileWaiting struct{ until time.Duration }

func (e *deletedWhileWaiting) Error() string {
	return fmt.Sprintf("a legitimate pod waits until %s, past the workflow's deletion", e.until)
}

// simulateHeld runs the history of seed under s and adds to t, holding the workflow's deletion
// until none of its nodes waits (generateHolding): each time a node would wait past it, the
// history is made again with the deletion after that node's next try. It returns the history
// run.
func simulateHeld(seed uint64, s setting, t *tallies, log func(string, ...any)) (*history, error) {
	var hold time.Duration
	for range 200 {
		h := generateHolding(seed, hold)
		scratch := newTallies()
		err := simulate(h, s, scratch, log)
		var w *deletedWhileWaiting
		if errors.As(err, &w) {
			hold = w.until + time.Millisecond
			continue
		}
		if err != nil {
			return h, err
		}
		if hold > 0 {
			scratch.held++
		}
		t.add(scratch)
		return h, nil
	}
	return nil, fmt.Errorf("history %d: a node still waits at the workflow's deletion after 200 holds", seed)
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
	opts.LiveReadTimeout, opts.LiveReadBudget, opts.HookStepReadBudget = 100*time.Microsecond, 10*time.Second, 10*time.Second
	g, err := newGuard(reader, store, opts)
	if err != nil {
		return err
	}
	// A decision whose every attempt is planned to fail ends at once with the simReader's error,
	// as liveRead would after its last attempt: its pauses between attempts run on the real
	// clock, and cost the run seconds a history where most decisions of a level fail.
	read := g.readLive
	g.readLive = func(ctx context.Context, namespace, name string, p readPolicy) (*argo.Workflow, error) {
		if dp, ok := ctx.Value(planKey{}).(*decisionPlan); ok && !slices.Contains(dp.plan, false) {
			return nil, apierrors.NewServiceUnavailable("simulated: the API server cannot answer")
		}
		return read(ctx, namespace, name, p)
	}
	// Row T7's memory on the virtual clock: on the real one, every create would repeat one
	// admitted milliseconds before.
	g.taskSets().creates = newTaskSetCreates(clk.Now, g.opts.TaskSetRepeatsFor)
	// The bound of the store's refusals (--store-refusals-for) on the virtual clock too.
	g.overturns = newOverturns(clk.Now)
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
		dp := &decisionPlan{now: tr.at, truthAt: tr.at, plan: planFor(h, pi, tr.pass, tr.at, s.shortRead(p.kind))}
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
			if next, ok := nextTry(h, p, tr); p.uid == h.deletedUID && (!ok || next >= h.deletedAt) {
				// Its node waits past the model's deletion of the workflow, which Argo would
				// not have completed, nor deleted, meanwhile: the history is made again with
				// the deletion held (simulateHeld).
				if !ok {
					next = tr.at + *simRequeue
				}
				return &deletedWhileWaiting{until: next}
			}
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
		return judged(ctx, g, classify(meta))
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
	return judged(ctx, g, facts{namespace: simNamespace, role: roleTaskWrite, startsWork: true, update: p.gcOwner != "",
		owner: &metav1.OwnerReference{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind, Name: simName, UID: owner},
		object: &taskSetObject{namespace: simNamespace, name: simName, workflow: simName,
			tasks: []string{task}, templates: templates, reopened: p.stale}})
}

// judged is g's decision on f, and what the pipeline remembers of it in enforce mode: a refusal
// made from the store alone (overturns.note), which --store-refusals-for bounds.
func judged(ctx context.Context, g *guard, f facts) decision {
	d := g.decide(ctx, f)
	if d.deny {
		g.overturns.note(f, d)
	}
	return d
}

// oracleCovers and oracleDenies restate the policy of a setting, apart from the code under
// test: exit handlers, agent pods and TaskSet writes that add a task are always covered, hooks
// and steps unless --cover leaves them out; the deny phases are the setting's, Succeeded by
// default.
func oracleCovers(o Options, k role) bool {
	switch k {
	case roleExitHandler, roleAgent, roleTaskWrite:
		return true
	case roleHook:
		return !o.Cover.NoHooks
	}
	return !o.Cover.NoSteps
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
			if _, err := simulateHeld(h.seed, s, ts, t.Logf); err != nil {
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
			if _, err := simulateHeld(h.seed, s, results[si][li], nil); err != nil {
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
		if s.comparison {
			t.Logf("%s (a comparison, not asserted): %d lost, %d refused with a live answer, %d stale admitted on a live answer or without a look %v",
				s.name, sum(r.lost), r.legitDeniedWrongly, sum(r.staleMissedKnown), r.staleMissedKnown)
			continue
		}
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
