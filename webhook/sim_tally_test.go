package webhook

import (
	"fmt"
	"reflect"
	"time"
	"unsafe"

	"github.com/exit-guard/exit-guard/contract"
)

// tallies are what one setting did over every history.
type tallies struct {
	legit, stale int
	// held are the histories whose workflow's deletion the model held until no legitimate
	// pod of it waited (simulateHeld).
	held int
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

// add adds o's counts to t: numbers summed, maps summed by key, lists appended. Every field
// of tallies is one of those (add panics on another kind, so a new field cannot be left out).
func (t *tallies) add(o *tallies) {
	tv, ov := reflect.ValueOf(t).Elem(), reflect.ValueOf(o).Elem()
	for i := range tv.NumField() {
		// Unexported fields: reached through their addresses, as this package's own.
		f := reflect.NewAt(tv.Field(i).Type(), unsafe.Pointer(tv.Field(i).UnsafeAddr())).Elem() //nolint:gosec // G103: the test's own struct
		g := reflect.NewAt(ov.Field(i).Type(), unsafe.Pointer(ov.Field(i).UnsafeAddr())).Elem() //nolint:gosec // G103: as above
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(f.Int() + g.Int())
		case reflect.Map:
			if f.IsNil() {
				f.Set(reflect.MakeMap(f.Type()))
			}
			for it := g.MapRange(); it.Next(); {
				sum := it.Value().Int()
				if cur := f.MapIndex(it.Key()); cur.IsValid() {
					sum += cur.Int()
				}
				f.SetMapIndex(it.Key(), reflect.ValueOf(sum).Convert(f.Type().Elem()))
			}
		case reflect.Slice:
			f.Set(reflect.AppendSlice(f, g))
		default:
			panic(fmt.Sprintf("tallies.add: field %s of kind %s", tv.Type().Field(i).Name, f.Kind()))
		}
	}
}

func newTallies() *tallies {
	return &tallies{legitDenied: map[string]int{}, lost: map[string]int{}, staleMissedKnown: map[string]int{},
		windows: map[string]int{}, notCovered: map[string]int{}}
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

// total sums one setting's tallies over the load levels.
func total(per []*tallies) *tallies {
	out := newTallies()
	for _, r := range per {
		out.add(r)
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
