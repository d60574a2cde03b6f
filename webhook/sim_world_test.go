package webhook

import (
	"cmp"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// The randomized simulation: thousands of random workflow histories, each driven through the
// real decision code (guard.decide with its live read, and completionstore.Store) in virtual
// time, with an oracle that knows the true history. `make test` runs a short fixed-seed
// version; `make soak` runs 100,000 histories and writes the report of docs/evidence/reliability.md.
var (
	simHistories = flag.Int("sim.histories", 3000, "simulation: how many random workflow histories")
	simSeed      = flag.Uint64("sim.seed", 1, "simulation: the seed of the first history; history i uses seed+i")
	simReplay    = flag.Int64("sim.replay", -1, "simulation: replay only the history of this seed, printing every step")
	simReport    = flag.String("sim.report", "", "simulation: write the report, as Markdown, to this file")
	// simSucceededRetries: Argo retries a Succeeded workflow only with --restart-successful and
	// a node selector (FormulateRetryWorkflow refuses it otherwise), which teams use to re-run
	// a step by hand or from automation: rare. The default assumes 1 in 100 Succeeded runs.
	simSucceededRetries = flag.Float64("sim.succeeded-retries", 0.01, "simulation: the chance that a Succeeded run is retried (argo retry --restart-successful)")
	// simRequeue: a refused pod of a node (a 429, transient on every controller line) leaves
	// the node Pending and requeues the workflow; Argo's queue tries it again after a fixed
	// DEFAULT_REQUEUE_TIME (10 s unless set), with no backoff.
	simRequeue = flag.Duration("sim.requeue", 10*time.Second, "simulation: Argo's DEFAULT_REQUEUE_TIME, the interval between a refused pass and the next")
)

// simResync is Argo's workflow resync period: what wakes a workflow that nothing else does
// (a refused TaskSet write is only logged; the workflow's own status write wakes it once).
const simResync = 20 * time.Minute

// simHorizon is how long a refused legitimate pod or write may wait before the simulation
// calls it lost (the store forgets a completion after 10 minutes by default).
const simHorizon = time.Hour

// Controller lines, as far as a refusal goes: on v3.4 (and 3.5) an agent pod's create error
// makes the workflow Error, and a Succeeded workflow cannot be retried; on 3.6 and later a
// refused agent pod is requeued like a node's pod, and argo retry --restart-successful with a
// node selector may pick the exit handler alone, which then runs within a second of the retry.
const (
	lineV34   = "3.4/3.5"
	lineV36Up = "3.6+"
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

// podEvent is a pod creation, or a TaskSet write that adds a task: by the real controller
// (legit) or by a stale copy.
type podEvent struct {
	at    time.Duration
	uid   types.UID
	kind  role
	stale bool
	// For a TaskSet write of a workflow that reused the name while the deleted workflow's
	// TaskSet was still there (the garbage collector not done yet): Argo's create fails
	// with AlreadyExists and its patch, an update, keeps the old owner, gcOwner, until
	// gcAt.
	gcOwner types.UID
	gcAt    time.Duration
	// heldFor is how long Argo's informer holds a stale copy: while the guard refuses what it
	// sends, it tries again every requeue within that time.
	heldFor time.Duration
	// firstPass: the write of the pass that creates the task's node, which Argo writes to
	// the workflow's status only after the TaskSet; nextPass is when the workflow's next pass
	// writes the task again (row T6 reads the node then), for such a write that met the old
	// TaskSet.
	firstPass bool
	nextPass  time.Duration
	// sameReplica: the guard replica that judges such a patch judged the create before it
	// (row T6 remembers it); otherwise another replica did.
	sameReplica bool
	// inExitHandler: a TaskSet write of the exit handler's task (its node is named inside the
	// exit handler).
	inExitHandler bool
	// exitTask: a TaskSet write of the workflow-level exit handler's own task (an onExit
	// template that is itself an HTTP template), whose node ID the guard knows; otherwise
	// the write's task is another node's (an HTTP step inside the exit handler's steps among
	// them).
	exitTask bool
}

// loadLevel is how loaded the API server is during a history: how late the guard's watch
// delivers, how often the guard's live reads fail, and how often a stale copy comes back.
type loadLevel struct {
	name string
	// lagMean is the mean watch delay (exponential).
	lagMean time.Duration
	// busy: other workflows' events move the watch every 0.2 to 2 s; otherwise only this
	// history's events and the API server's bookmarks (about every minute) do.
	busy bool
	// stallProb is the chance that the watch stalls once, for stall.
	stallProb float64
	stall     time.Duration
	// attemptFail is the chance that one live-read attempt fails; outage the chance that
	// every attempt of a decision fails (no live answer within the 4 s of --live-read-budget);
	// outageShort the further chance that a decision read within 750 ms (hook and step pods'
	// --hook-step-read-budget) gets no answer in time.
	attemptFail, outage, outageShort float64
	// cutOff: once, near a completion, the guard loses the API server for 30 s to 5 min:
	// every live read fails and its watch delivers nothing (no event, no bookmark), while
	// Argo's controller and argo retry go on writing (the worst case for a store fallback).
	cutOff bool
	// staleProb is the chance that a completion's stale copy comes back: stale copies come
	// with load.
	staleProb float64
}

// The load levels and their shares. The shares are assumptions (the report gives every
// level apart, so they weigh only the totals); the busy levels' read failures are measured:
// TestLiveReadsUnderPriorityAndFairness (docs/evidence/reliability.md, "Under load") had no live
// answer for 6 of 800 decisions without the chart's FlowSchema and for 0 of 800 with it.
var loadLevels = []struct {
	share float64
	level loadLevel
}{
	{0.55, loadLevel{name: "idle", lagMean: 20 * time.Millisecond, attemptFail: 0.001, staleProb: 0.02}},
	{0.15, loadLevel{name: "busy, FlowSchema", lagMean: 2 * time.Second, busy: true, stallProb: 0.1, stall: 30 * time.Second,
		attemptFail: 0.05, outage: 0, staleProb: 0.5}},
	{0.15, loadLevel{name: "busy, no FlowSchema", lagMean: 2 * time.Second, busy: true, stallProb: 0.1, stall: 30 * time.Second,
		attemptFail: 0.05, outage: 6.0 / 800, outageShort: shortBudgetOutage, staleProb: 0.5}},
	{0.15, loadLevel{name: "guard cut off", lagMean: 2 * time.Second, busy: true, attemptFail: 0.05, outage: 6.0 / 800, outageShort: shortBudgetOutage,
		cutOff: true, staleProb: 0.5}},
}

// shortBudgetOutage is the further share of decisions with no live answer within 750 ms
// (--hook-step-read-budget) beside a flood that API Priority and Fairness queues, with no
// FlowSchema for the guard (docs/evidence/reliability.md, "Under load"): make overload,
// exit-handler pods, 2,000 decisions each, had no answer for 66.5% within 750 ms and 1.05%
// within 4 s; step pods within 750 ms, 65.9%. With the chart's FlowSchema every role's reads
// answered within 750 ms.
const shortBudgetOutage = 0.65

// loadLevelNames are the levels' names, in order.
func loadLevelNames() []string {
	var out []string
	for _, l := range loadLevels {
		out = append(out, l.level.name)
	}
	return out
}

// history is one generated world: the truth, the pods, and what the guard's watch delivers.
type history struct {
	seed   uint64
	load   loadLevel
	line   string  // the controller line (lineV34, lineV36Up)
	writes []write // in time order; resourceVersions increase with time
	pods   []podEvent
	watch  []watchAction
	// plans says, per pod event, which live-read attempts fail.
	plans [][]bool
	// The guard is cut off from the API server from cutFrom to cutTo (cutTo 0: never).
	cutFrom, cutTo time.Duration
	// deletedUID is the workflow its ttlStrategy deletes, at deletedAt (deletedUID empty:
	// none); hold is the earliest the model may delete it (generateHolding).
	deletedUID      types.UID
	deletedAt, hold time.Duration
}

// cut says whether the guard is cut off from the API server at t.
func (h *history) cut(t time.Duration) bool { return h.cutTo > 0 && t >= h.cutFrom && t < h.cutTo }

const (
	simNamespace = "sim"
	simName      = "wf"
)

func dur(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// generate makes the history of seed.
func generate(seed uint64) *history { return generateHolding(seed, 0) }

// generateHolding makes the history of seed with its workflow's deletion (ttlStrategy) held
// until hold at the earliest: Argo does not complete a workflow, so does not delete it, while
// one of its nodes waits (a legitimate pod refused, which Argo sends again), and simulateHeld
// holds the deletion until no node waits then. Every draw is the same as without the hold, so
// the history is the same up to the deletion, and what follows it comes as much later.
func generateHolding(seed uint64, hold time.Duration) *history {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h := &history{seed: seed, hold: hold}
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
	// An assumption (the report gives each line's losses apart): most exposed clusters run
	// 3.6 or later, many still 3.4 or 3.5.
	h.line = lineV36Up
	if r.Float64() < 0.4 {
		h.line = lineV34
	}
	put := func(at time.Duration, s wfState) {
		h.writes = append(h.writes, write{at: at, state: s})
	}
	pod := func(at time.Duration, uid types.UID, kind role, stale bool) {
		h.pods = append(h.pods, podEvent{at: at, uid: uid, kind: kind, stale: stale})
	}
	// taskWrites are the TaskSet writes of each workflow, by index in h.pods, for the name
	// reuse below.
	taskWrites := map[types.UID][]int{}
	taskWrite := func(at time.Duration, uid types.UID) {
		pod(at, uid, roleTaskWrite, false)
		taskWrites[uid] = append(taskWrites[uid], len(h.pods)-1)
	}
	// A pod runs for at least a second from its creation to the controller seeing it done
	// (scheduling, start, the kubelet's status, the pod informer).
	stepTime := func() time.Duration { return dur(r, time.Second, 10*time.Second) }
	// lifecycle runs one workflow from its creation to its last completion and returns when
	// it ended, the moments it completed, and whether it has HTTP templates.
	lifecycle := func(uid types.UID, t time.Duration) (time.Duration, []time.Duration, bool) {
		http := r.Float64() < 0.3
		put(t, wfState{uid: uid})
		var completions []time.Duration
		var end argo.Phase
		// exitHandler creates the exit handler's pod at t (and, for an HTTP workflow, writes
		// its task: the exit handler's own in half) and returns when it is done.
		exitHandler := func(t time.Duration) time.Duration {
			pod(t, uid, roleExitHandler, false)
			if http {
				taskWrite(t, uid)
				h.pods[len(h.pods)-1].exitTask = r.Float64() < 0.5
				h.pods[len(h.pods)-1].inExitHandler = true
			}
			return t + dur(r, 100*time.Millisecond, 3*time.Second)
		}
		run := func(t time.Duration, phase argo.Phase, exitOnly bool) time.Duration {
			put(t, wfState{uid: uid, phase: phase})
			if exitOnly {
				// argo retry --restart-successful --node-field-selector picking the exit
				// handler alone (3.6 and later): nothing runs before it, and its pod comes
				// within a second of the retry's write.
				t = exitHandler(t + dur(r, 50*time.Millisecond, time.Second))
				end = argo.PhaseSucceeded
				put(t, wfState{uid: uid, phase: end})
				completions = append(completions, t)
				return t
			}
			// A run (a first run or a retry) creates its step pods first: a retry re-runs
			// the nodes it reset (for a Succeeded workflow, those the node selector picked)
			// before its exit handler; a workflow with HTTP or plugin templates writes its
			// TaskSet and creates its agent pod.
			t += dur(r, 50*time.Millisecond, time.Second)
			if http {
				taskWrite(t, uid)
				pod(t, uid, roleAgent, false)
			}
			for range 1 + r.IntN(3) {
				pod(t, uid, roleStep, false)
				if r.Float64() < 0.3 {
					pod(t+time.Millisecond, uid, roleHook, false)
				}
				t += stepTime()
			}
			if r.Float64() < 0.9 {
				t = exitHandler(t)
			}
			end = []argo.Phase{argo.PhaseSucceeded, argo.PhaseSucceeded, argo.PhaseSucceeded, argo.PhaseSucceeded,
				argo.PhaseSucceeded, argo.PhaseSucceeded, argo.PhaseSucceeded, argo.PhaseFailed, argo.PhaseFailed, argo.PhaseError}[r.IntN(10)]
			put(t, wfState{uid: uid, phase: end})
			completions = append(completions, t)
			return t
		}
		t = run(t+dur(r, 50*time.Millisecond, 500*time.Millisecond), argo.PhaseRunning, false)
		for {
			// argo retry: a Failed or Error workflow often; a Succeeded one only with
			// --restart-successful (rare, -sim.succeeded-retries).
			p := 0.2
			if end == argo.PhaseSucceeded {
				p = *simSucceededRetries
				if h.line == lineV34 {
					p = 0 // FormulateRetryWorkflow refuses a Succeeded workflow there
				}
			}
			// A Succeeded workflow's retry re-runs the nodes its selector picks: the exit
			// handler alone in half of them.
			exitOnly := end == argo.PhaseSucceeded && r.Float64() < 0.5
			if r.Float64() >= p {
				break
			}
			// Automation retries within seconds, people within minutes.
			if r.Float64() < 0.4 {
				t += dur(r, 500*time.Millisecond, 5*time.Second)
			} else {
				t += dur(r, 30*time.Second, 10*time.Minute)
			}
			retried := argo.PhaseRunning // up to 3.7
			if r.Float64() < 0.5 {
				retried = argo.PhaseUnknown // v4
			}
			t = run(t, retried, exitOnly)
		}
		return t, completions, http
	}
	var all []time.Duration // every completion, for the cut-off below
	stale := func(uid types.UID, completions []time.Duration) {
		all = append(all, completions...)
		for _, c := range completions {
			if r.Float64() >= h.load.staleProb {
				continue
			}
			// A stale copy comes back soon after the completion, as a rule.
			at := c + dur(r, 10*time.Millisecond, 20*time.Second)
			if r.Float64() < 0.1 {
				at = c + dur(r, 20*time.Second, 15*time.Minute)
			}
			// While refused it comes back every requeue, for as long as Argo's informer holds
			// it: about 2 s on real controllers (docs/evidence/argo-e2e.md: 2 to 3 passes at a requeue
			// of 1 s); here up to 3 s, and in one case in five (a watch that lags) up to a
			// minute.
			first, held := len(h.pods), dur(r, 0, 3*time.Second)
			if r.Float64() < 0.2 {
				held = dur(r, 3*time.Second, time.Minute)
			}
			pod(at, uid, roleExitHandler, true)
			if r.Float64() < 0.5 {
				pod(at-time.Millisecond, uid, roleStep, true) // argo-workflows #16294
			}
			if r.Float64() < 0.3 {
				pod(at+time.Millisecond, uid, roleHook, true)
			}
			if r.Float64() < 0.3 {
				// An HTTP exit handler: the stale copy adds its task to the TaskSet and
				// creates a new agent pod.
				pod(at+time.Millisecond, uid, roleTaskWrite, true)
				h.pods[len(h.pods)-1].exitTask = r.Float64() < 0.5
				pod(at+2*time.Millisecond, uid, roleAgent, true)
			}
			for i := first; i < len(h.pods); i++ {
				h.pods[i].heldFor = held
			}
		}
	}
	uid1 := types.UID(fmt.Sprintf("uid-%d-1", seed))
	end, completions, http1 := lifecycle(uid1, 0)
	stale(uid1, completions)
	if r.Float64() < 0.4 {
		// ttlStrategy deletes it; the name may be used again.
		del := max(end+dur(r, time.Second, 2*time.Minute), hold)
		put(del, wfState{uid: uid1, phase: h.writes[len(h.writes)-1].state.phase, deleted: true})
		h.deletedUID, h.deletedAt = uid1, del
		if r.Float64() < 0.5 {
			uid2 := types.UID(fmt.Sprintf("uid-%d-2", seed))
			_, c2, _ := lifecycle(uid2, del+dur(r, 100*time.Millisecond, 30*time.Second))
			stale(uid2, c2)
			if http1 {
				// The garbage collector deletes the first workflow's TaskSet some time after
				// the workflow (seconds idle, longer under load). Until then each TaskSet
				// write of the second is a create that fails with AlreadyExists, then a
				// patch of the old TaskSet, which keeps the old owner reference.
				gc := del + dur(r, time.Second, 10*time.Second)
				if h.load.busy {
					gc = del + dur(r, 5*time.Second, 2*time.Minute)
				}
				// Argo writes a task first in the pass that creates its node, and again in
				// the next pass (the workflow's own status write wakes it) while the node
				// waits for its agent; the node is in the status by then (row T6).
				for _, i := range taskWrites[uid2] {
					if h.pods[i].at < gc {
						next := h.pods[i]
						next.at += dur(r, time.Second, 10*time.Second)
						h.pods[i].gcOwner, h.pods[i].gcAt = uid1, gc
						h.pods[i].firstPass, h.pods[i].nextPass = true, next.at
						h.pods[i].sameReplica = r.Float64() < 0.5
						next.sameReplica = r.Float64() < 0.5
						if slices.ContainsFunc(c2, func(c time.Duration) bool { return c > h.pods[i].at && c <= next.at }) {
							// The workflow completed first: no next pass writes the task.
							h.pods[i].nextPass = gc
							continue
						}
						if next.at < gc {
							next.gcOwner, next.gcAt = uid1, gc
						}
						h.pods = append(h.pods, next)
					}
				}
			}
		}
		if r.Float64() < 0.3 {
			pod(del+dur(r, 10*time.Millisecond, 10*time.Second), uid1, roleExitHandler, true)
			h.pods[len(h.pods)-1].heldFor = dur(r, 0, 3*time.Second)
		}
	}
	// The second lifecycle's writes were appended after the deletion; keep time order (each
	// lifecycle's writes are in order; the stale pods are sorted below). ResourceVersions
	// leave room between writes for the events of other workflows (busy levels).
	slices.SortStableFunc(h.writes, func(a, b write) int { return cmp.Compare(a.at, b.at) })
	for i := range h.writes {
		h.writes[i].state.rv = rvStep * (101 + int64(i))
	}
	slices.SortStableFunc(h.pods, func(a, b podEvent) int { return cmp.Compare(a.at, b.at) })
	if h.load.cutOff && len(all) > 0 {
		// The guard loses the API server close to a completion, before or after it.
		c := all[r.IntN(len(all))]
		h.cutFrom = max(0, c+dur(r, -10*time.Second, 20*time.Second))
		h.cutTo = h.cutFrom + dur(r, 30*time.Second, 5*time.Minute)
	}
	h.watch = h.generateWatch(r)
	for _, p := range h.pods {
		plan := make([]bool, maxLiveReadAttempts)
		outage := h.cut(p.at) || r.Float64() < h.load.outage
		for k := range plan {
			plan[k] = outage || r.Float64() < h.load.attemptFail
		}
		h.plans = append(h.plans, plan)
	}
	return h
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

// movedOn says whether workflow uid completed or was deleted after from, up to to.
func (h *history) movedOn(uid types.UID, from, to time.Duration) bool {
	for _, w := range h.writes {
		if w.at > from && w.at <= to && w.state.uid == uid && (w.state.deleted || w.state.phase.Terminal()) {
			return true
		}
	}
	return false
}
