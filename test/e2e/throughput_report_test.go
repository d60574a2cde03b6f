//go:build e2e

package e2e

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// q is the quantile at f of d.
func q(d []time.Duration, f float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(f*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))].Round(10 * time.Millisecond)
}

// writeThroughputReport writes two Markdown tables per load. The first, for each configuration:
// the median over the rounds of its workflows per minute and of its ratio to no webhook in the
// same round, the ratios' geometric mean with its 95% interval (Student's t over the rounds;
// from two rounds) and their lowest and highest, create-to-done p50 and p99 over every
// workflow of every round, the mean time a workflow held a parallelism slot, the webhook
// calls, the time Argo's writes waited on webhooks per workflow and as a share of the slot
// time (under a parallelism limit the rate is the slots over the mean time a workflow holds
// one: that share bounds what the calls take from it), and the controller's queue figures. The
// second, when the do-nothing webhook ran, compares each configuration with it, round by round
// (writeFloorTable). The third splits the calls by webhook.
func writeThroughputReport(w *strings.Builder, version string, p throughputParams, all []throughputRun) {
	for _, load := range p.loads {
		for _, mix := range p.mixes {
			var runs []throughputRun
			for _, r := range all {
				if r.load == load && r.mix == mix {
					runs = append(runs, r)
				}
			}
			writeThroughputTables(w, fmt.Sprintf("%s, API server %s, %s mix", version, load, mix), p, runs)
		}
	}
}

// writeThroughputTables writes writeThroughputReport's tables for the runs of one load and mix,
// under title.
func writeThroughputTables(w *strings.Builder, title string, p throughputParams, all []throughputRun) {
	fmt.Fprintf(w, "\n**%s**: %d workflows per batch, parallelism %d, %d round(s)\n\n", title, p.workflows, p.parallelism, p.rounds)
	fmt.Fprintln(w, "| configuration | workflows/min (median) | ratio to no webhook (median) | ratio, geometric mean (95% interval) | ratio, lowest to highest | create to done p50 | p99 | slot held (mean) | webhook calls per batch | mean call | webhook wait per workflow | share of slot time | controller queue adds | mean queue wait |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	base := map[int]float64{}
	for _, r := range all {
		if r.config == noWebhook {
			base[r.round] = r.perMinute
		}
	}
	hooks, runsOf := map[string]map[string]hookCalls{}, map[string]int{}
	for _, config := range p.configs {
		var rates, ratios []float64
		var done []time.Duration
		var calls, adds, waited, heldSum float64
		var callMean, wait time.Duration
		n := 0
		for _, r := range all {
			if r.config != config {
				continue
			}
			n++
			rates = append(rates, r.perMinute)
			if b := base[r.round]; b > 0 {
				ratios = append(ratios, r.perMinute/b)
			}
			done = append(done, r.done...)
			for _, d := range r.held {
				heldSum += d.Seconds()
			}
			calls, adds, callMean, wait = calls+r.calls, adds+r.queueAdds, callMean+r.callMean, wait+r.queueWait
			if hooks[config] == nil {
				hooks[config] = map[string]hookCalls{}
			}
			for name, h := range r.byHook {
				waited += h.seconds
				a := hooks[config][name]
				a.count, a.seconds = a.count+h.count, a.seconds+h.seconds
				hooks[config][name] = a
			}
		}
		if n == 0 {
			continue
		}
		runsOf[config] = n
		slices.Sort(ratios)
		spread, interval := "-", "-"
		if len(ratios) > 0 {
			spread = fmt.Sprintf("%.3f to %.3f", ratios[0], ratios[len(ratios)-1])
			if config != noWebhook && len(ratios) > 1 {
				m, lo, hi := geometricInterval(ratios)
				interval = fmt.Sprintf("%.3f (%.3f to %.3f)", m, lo, hi)
			}
		}
		perWorkflow, share := 0.0, 0.0
		if len(done) > 0 {
			perWorkflow = waited / float64(len(done))
			share = waited / heldSum
		}
		fmt.Fprintf(w, "| %s | %.2f | %.3f | %s | %s | %s | %s | %s | %.0f | %s | %s | %.2f%% | %.0f | %s |\n", config, median(rates), median(ratios), interval, spread,
			q(done, 0.5), q(done, 0.99), time.Duration(heldSum/float64(max(1, len(done)))*float64(time.Second)).Round(10*time.Millisecond), calls/float64(n), (callMean / time.Duration(n)).Round(10*time.Microsecond),
			time.Duration(perWorkflow*float64(time.Second)).Round(100*time.Microsecond), 100*share, adds/float64(n),
			(wait / time.Duration(n)).Round(10*time.Microsecond))
	}
	writeFloorTable(w, title, p, all)
	fmt.Fprintf(w, "\nCalls by webhook, per batch (mean over the rounds), %s:\n\n", title)
	fmt.Fprintln(w, "| configuration | webhook | calls per batch | mean call | waited per batch |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, config := range p.configs {
		names := make([]string, 0, len(hooks[config]))
		for name := range hooks[config] {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			h := hooks[config][name]
			// Over the runs of the configuration: a webhook no call reached in a run
			// counts that run as 0.
			h.count, h.seconds = h.count/float64(runsOf[config]), h.seconds/float64(runsOf[config])
			mean := time.Duration(0)
			if h.count > 0 {
				mean = time.Duration(h.seconds / h.count * float64(time.Second))
			}
			fmt.Fprintf(w, "| %s | %s | %.1f | %s | %s |\n", config, name, h.count, mean.Round(10*time.Microsecond),
				time.Duration(h.seconds*float64(time.Second)).Round(time.Millisecond))
		}
	}
}

// writeFloorTable compares each configuration with the do-nothing webhook of the same round
// (nothing when it did not run): the ratio of their rates (geometric mean, 95% interval), the
// difference of their webhook waits as a share of the slot time (mean, 95% interval: what the
// configuration's calls can take from the rate beyond what any webhook's would), and the CPU
// the webhook's process spent per call.
func writeFloorTable(w *strings.Builder, title string, p throughputParams, all []throughputRun) {
	floor := map[int]throughputRun{}
	for _, r := range all {
		if r.config == doNothing {
			floor[r.round] = r
		}
	}
	if len(floor) == 0 {
		return
	}
	fmt.Fprintf(w, "\nAgainst the do-nothing webhook, round by round, %s:\n\n", title)
	fmt.Fprintln(w, "| configuration | rounds | ratio to the do-nothing webhook, geometric mean (95% interval) | webhook wait above it, share of slot time (mean, 95% interval) | webhook CPU per call | webhook CPU per batch |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, config := range p.configs {
		if config == noWebhook {
			continue
		}
		var ratios, above []float64
		var cpu time.Duration
		var calls float64
		n := 0
		for _, r := range all {
			f, ok := floor[r.round]
			if r.config != config || !ok {
				continue
			}
			n++
			ratios = append(ratios, r.perMinute/f.perMinute)
			above = append(above, waitShare(r)-waitShare(f))
			cpu += r.served
			calls += r.calls
		}
		if n == 0 {
			continue
		}
		ratio, wait := "-", "-"
		if config != doNothing {
			m, lo, hi := geometricInterval(ratios)
			ratio = fmt.Sprintf("%.3f (%.3f to %.3f)", m, lo, hi)
			m, lo, hi = meanInterval(above)
			wait = fmt.Sprintf("%.2f%% (%.2f%% to %.2f%%)", 100*m, 100*lo, 100*hi)
		}
		perCall := "-"
		if calls > 0 {
			perCall = (cpu / time.Duration(calls)).Round(10 * time.Microsecond).String()
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s |\n", config, n, ratio, wait, perCall, (cpu / time.Duration(n)).Round(time.Millisecond))
	}
}

// waitShare is the time the API server spent in webhook calls for r's batch, as a share of the
// time its workflows held parallelism slots.
func waitShare(r throughputRun) float64 {
	var waited, held float64
	for _, h := range r.byHook {
		waited += h.seconds
	}
	for _, d := range r.held {
		held += d.Seconds()
	}
	if held == 0 {
		return 0
	}
	return waited / held
}

// meanInterval is the mean of v with its 95% interval (Student's t for len(v)-1 degrees of
// freedom); with one value the interval is that value.
func meanInterval(v []float64) (mean, lo, hi float64) {
	var sum, sq float64
	for _, x := range v {
		sum += x
	}
	n := float64(len(v))
	m := sum / n
	if len(v) < 2 {
		return m, m, m
	}
	for _, x := range v {
		sq += (x - m) * (x - m)
	}
	half := studentT975(len(v)-1) * math.Sqrt(sq/(n-1)) / math.Sqrt(n)
	return m, m - half, m + half
}

// geometricInterval is the geometric mean of ratios with its 95% interval: the mean of their
// logarithms plus or minus Student's t for len(ratios)-1 degrees of freedom times its standard
// error. With one ratio the interval is that ratio.
func geometricInterval(ratios []float64) (mean, lo, hi float64) {
	n := float64(len(ratios))
	var sum, sq float64
	for _, r := range ratios {
		sum += math.Log(r)
	}
	m := sum / n
	if len(ratios) < 2 {
		return math.Exp(m), math.Exp(m), math.Exp(m)
	}
	for _, r := range ratios {
		sq += (math.Log(r) - m) * (math.Log(r) - m)
	}
	half := studentT975(len(ratios)-1) * math.Sqrt(sq/(n-1)) / math.Sqrt(n)
	return math.Exp(m), math.Exp(m - half), math.Exp(m + half)
}

// studentT975 is the 97.5th percentile of Student's t with df degrees of freedom (df ≥ 1),
// from the usual table; between its rows, the row of the next smaller df (a wider interval).
func studentT975(df int) float64 {
	table := []struct {
		df int
		t  float64
	}{{1, 12.706}, {2, 4.303}, {3, 3.182}, {4, 2.776}, {5, 2.571}, {6, 2.447}, {7, 2.365}, {8, 2.306}, {9, 2.262},
		{10, 2.228}, {12, 2.179}, {15, 2.131}, {20, 2.086}, {30, 2.042}, {60, 2.000}, {120, 1.980}}
	for i := len(table) - 1; i > 0; i-- {
		if df >= table[i].df {
			return table[i].t
		}
	}
	return table[0].t
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
