package webhook

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// label is the setting's name as the report's tables give it.
func (s setting) label() string {
	if s.comparison {
		return "`" + s.name + "` (a comparison: its goals are measured, not asserted)"
	}
	return "`" + s.name + "`"
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
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %d | %d | %d, %d | %d | %d | %d | %d, %d | %d | %d (%s) |\n", s.label(), r.legit, r.delayed, delayFigures(r.delays), sum(r.lost),
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
		if r.held > 0 {
			fmt.Fprintf(&b, "- %d histories had their workflow's deletion held until no legitimate pod of it waited (Argo completes, and ttlStrategy deletes, a workflow only once its nodes have run)\n", r.held)
		}
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
