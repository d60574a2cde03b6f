package webhook

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/exit-guard/exit-guard/completionstore"
)

// watchAction is something the guard's watch does to its store at a moment.
type watchAction struct {
	at time.Duration
	// obs is an observation to feed (an event, a replayed event, a relist's state or its
	// DeletedFinalStateUnknown); restart replaces the store with an empty one first.
	obs      *completionstore.Observation
	restart  bool
	bookmark int64 // a bookmark's resourceVersion, when set
	// lag, when sampled: how long after its write (to the second, as managed fields tell it)
	// the change arrived: the store's lag sample.
	lag     time.Duration
	sampled bool
	what    string
}

// measuredLag is the lag the guard measures for a write at w delivered at at: managed fields
// tell a write's time to the second.
func measuredLag(w, at time.Duration) time.Duration { return at - w.Truncate(time.Second) }

// rvStep is the spacing of a history's resourceVersions: the events of other workflows fall
// between them.
const rvStep = 1000

// generateWatch makes what the guard's watch delivers: every write, late by a random lag, in
// order; bookmarks, and on busy levels other workflows' events; perhaps a stall or the guard
// cut off, a replayed older event, a relist, a restart of the guard.
func (h *history) generateWatch(r *rand.Rand) []watchAction {
	var out []watchAction
	lag := func() time.Duration {
		return time.Duration(r.ExpFloat64() * float64(h.load.lagMean))
	}
	last := h.writes[len(h.writes)-1].at
	var stallFrom, stallTo time.Duration = -1, -1
	switch {
	case h.cutTo > 0:
		stallFrom, stallTo = h.cutFrom, h.cutTo
	case r.Float64() < h.load.stallProb:
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
		out = append(out, watchAction{at: at, obs: obsOf(w.state), lag: measuredLag(w.at, at), sampled: true, what: "event"})
	}
	if h.load.busy {
		// Other workflows' events: the watch advances past this history's last delivered
		// write, between its resourceVersions.
		events := slices.Clone(out)
		var rv, k int64
		ei := 0
		for t := dur(r, 0, 2*time.Second); t < last+15*time.Minute; t += dur(r, 200*time.Millisecond, 2*time.Second) {
			for ; ei < len(events) && events[ei].at <= t; ei++ {
				if n, _ := strconv.ParseInt(events[ei].obs.ResourceVersion, 10, 64); n > rv {
					rv, k = n, 0
				}
			}
			if (t >= stallFrom && t < stallTo) || k >= rvStep-1 {
				continue
			}
			k++
			// Its write happened lag() before, at a moment of its own within the second.
			written := t - lag()
			out = append(out, watchAction{at: t, bookmark: max(rv, rvStep) + k, lag: measuredLag(written, t), sampled: true, what: "another workflow's event"})
		}
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
		at := dur(r, w.at, last+time.Minute)
		out = append(out, watchAction{at: at, obs: o, lag: measuredLag(w.at, at), sampled: true, what: "replayed older event"})
	}
	if r.Float64() < 0.2 {
		// A relist (410 Gone, or a broken watch): the current state of every workflow, and a
		// DeletedFinalStateUnknown, with the informer's last copy, for those gone meanwhile.
		t := dur(r, 0, last+time.Minute)
		had := deliveredAt(out, t)
		now := truthAt(t - lag())
		writtenAt := map[int64]time.Duration{}
		for _, w := range h.writes {
			writtenAt[w.state.rv] = w.at
		}
		for uid, s := range now {
			if !s.deleted {
				// A state the informer did not have comes as an update: a lag sample of it.
				a := watchAction{at: t, obs: obsOf(s), what: "relist"}
				if o, ok := had[uid]; !ok || o.ResourceVersion != a.obs.ResourceVersion {
					a.lag, a.sampled = measuredLag(writtenAt[s.rv], t), true
				}
				out = append(out, a)
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
	slices.SortStableFunc(out, func(a, b watchAction) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		// A restart comes before what else happens at its moment.
		switch {
		case a.restart && !b.restart:
			return -1
		case b.restart && !a.restart:
			return 1
		}
		return 0
	})
	return out
}
