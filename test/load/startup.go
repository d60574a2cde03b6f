package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/figure"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// runStartup measures, with N retained workflows, how long after its start each watcher is
// Ready and how much memory it holds: at its peak (the initial list) and once settled. The
// guard also has to decide right once Ready: the exit handler of a retained Succeeded workflow
// refused, that of a running one admitted (server-side dry runs through the API server).
func runStartup(args []string) error {
	fs := flag.NewFlagSet("startup", flag.ContinueOnError)
	var c common
	c.register(fs, 30*time.Minute)
	n := fs.Int("workflows", 10000, "Retained (Succeeded) workflows.")
	size := fs.Int("size-kb", 32, "Size of most workflows, in KB of JSON.")
	large := fs.Int("large-kb", 300, "Size of the large workflows, in KB.")
	largeEvery := fs.Int("large-every", 100, "One workflow in this many is large (0: none).")
	settle := fs.Duration("settle", 15*time.Second, "How long after Ready the steady memory is read.")
	plotPath := fs.String("plot", "", "Also draw time to Ready and memory per workflow as an SVG at this path.")
	watchers := fs.String("watchers", "exit-guard,"+shapePhase+","+shapeFull, "The watchers measured, in order.")
	compare := fs.String("compare", "", "Another guard binary (an earlier commit's) to restart beside this one, alternated over --rounds on the same data.")
	rounds := fs.Int("rounds", 0, "Rounds of back-to-back restarts: each round restarts the guard (and --compare), in a random order, and times a metadata LIST of the workflows beside them (0: none).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel, err := c.context()
	if err != nil {
		return err
	}
	defer cancel()
	sz := sizes{size: *size * 1000, large: *large * 1000, largeEvery: *largeEvery}

	env, cl, err := startAPIServer(true)
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()

	type row struct {
		watcher   string
		workflows int
		ready     time.Duration
		at        memory // at Ready
		settled   memory
	}
	var rows []row
	measure := func(watcher string, workflows int) (row, error) {
		var p *process
		var err error
		switch watcher {
		case "exit-guard":
			p, err = startGuard(c.guard, env, env.WebhookPort)
		case "exit-guard (compared)":
			p, err = startGuard(*compare, env, env.WebhookPort)
		default:
			p, err = startWatcher(watcher, env.KubeConfig())
		}
		if err != nil {
			return row{}, err
		}
		defer p.stop()
		ready, err := p.waitReady(ctx)
		if err != nil {
			return row{}, err
		}
		r := row{watcher: watcher, workflows: workflows, ready: ready}
		if r.at, err = p.memory(); err != nil {
			return row{}, err
		}
		if strings.HasPrefix(watcher, "exit-guard") && workflows > 0 {
			if err := checkGuard(ctx, p, cl, workflows); err != nil {
				return row{}, err
			}
		}
		select {
		case <-ctx.Done():
			return row{}, errTimeout
		case <-time.After(*settle):
		}
		r.settled, err = p.memory()
		fmt.Fprintf(os.Stderr, "  %s with %d workflows: Ready after %s, RSS %s (peak %s), %s later %s\n",
			watcher, workflows, ready.Round(time.Millisecond), mib(r.at.rss), mib(r.at.peak), *settle, mib(r.settled.rss))
		return r, err
	}

	fmt.Fprintln(os.Stderr, "measuring the guard with no workflow")
	empty, err := measure("exit-guard", 0)
	if err != nil {
		return err
	}
	rows = append(rows, empty)
	fmt.Fprintf(os.Stderr, "creating %d Succeeded workflows (%s)\n", *n, sz)
	start := time.Now()
	bytes, _, err := createRetained(ctx, cl, "retained", 0, *n, sz, func(d int) { fmt.Fprintf(os.Stderr, "  %d created\n", d) })
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "created %d workflows, %s of JSON, in %s\n", *n, mib(bytes), time.Since(start).Round(time.Second))
	etcdBytes := dirSize(env.EtcdDataDir())
	fmt.Fprintf(os.Stderr, "etcd's data on disk: %s\n", mib(etcdBytes))
	for _, w := range strings.Split(*watchers, ",") {
		r, err := measure(w, *n)
		if err != nil {
			return err
		}
		rows = append(rows, r)
	}

	var backToBack []row
	var lists []time.Duration
	for round := 1; round <= *rounds; round++ {
		order := []string{"exit-guard"}
		if *compare != "" {
			order = append(order, "exit-guard (compared)")
		}
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] }) //nolint:gosec // G404: an order of restarts, not a secret
		for _, w := range order {
			r, err := measure(w, *n)
			if err != nil {
				return err
			}
			backToBack = append(backToBack, r)
		}
		d, err := listMetadata(ctx, cl, "retained")
		if err != nil {
			return err
		}
		lists = append(lists, d)
		fmt.Fprintf(os.Stderr, "  round %d: a metadata LIST of the workflows took %s\n", round, d.Round(time.Millisecond))
	}

	fmt.Printf("\n%d retained workflows, %s of JSON (%s), %s of etcd data on disk once created; memory read from /proc: VmHWM (peak) and VmRSS; settled = %s after Ready.\n\n",
		*n, mib(bytes), sz, mib(etcdBytes), *settle)
	fmt.Println("| watcher | workflows | Ready after | peak RSS | RSS at Ready | RSS settled | settled per workflow | peak / settled |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		per := "-"
		if r.workflows > 0 {
			base := empty.settled.rss
			if r.watcher != "exit-guard" {
				base = 0 // no empty run of the other watchers: their figure includes their fixed cost
			}
			per = fmt.Sprintf("%.2f KB", float64(r.settled.rss-base)/float64(r.workflows)/1000)
		}
		fmt.Printf("| %s | %d | %s | %s | %s | %s | %s | %.2f |\n", r.watcher, r.workflows, r.ready.Round(time.Millisecond),
			mib(r.at.peak), mib(r.at.rss), mib(r.settled.rss), per, float64(r.at.peak)/float64(r.settled.rss))
	}
	if len(backToBack) > 0 {
		// Back to back on the same data: each binary's restarts, and what the first list itself
		// costs (a paginated metadata LIST of the same workflows, timed in each round).
		listMedian := median(lists)
		fmt.Printf("\nBack to back, %d rounds on the same %d workflows, the binaries in a random order each round; a consistent metadata LIST of them (pages of 500, from etcd) took %s at the median (%s).\n\n",
			*rounds, *n, listMedian.Round(time.Millisecond), durations(lists))
		fmt.Println("| guard | Ready after each restart | median | median / the LIST | peak RSS (max) |")
		fmt.Println("|---|---|---|---|---|")
		for _, w := range []string{"exit-guard", "exit-guard (compared)"} {
			var ds []time.Duration
			var peak int64
			for _, r := range backToBack {
				if r.watcher == w {
					ds = append(ds, r.ready)
					peak = max(peak, r.at.peak)
				}
			}
			if len(ds) == 0 {
				continue
			}
			name := w
			if w != "exit-guard" {
				name = "compared: " + *compare
			}
			fmt.Printf("| %s | %s | %s | %.2f | %s |\n", name, durations(ds), median(ds).Round(time.Millisecond),
				median(ds).Seconds()/listMedian.Seconds(), mib(peak))
		}
	}
	// The runs with the workflows (not the guard's empty one), each watcher a point.
	ready := figure.Panel{Title: fmt.Sprintf("Ready after a restart, %d workflows", *n), YLabel: "seconds (log)", Dots: true}
	peak := figure.Panel{Title: "peak RSS", YLabel: "MiB (log)", Dots: true}
	perWorkflow := figure.Panel{Title: "settled RSS per workflow", YLabel: "KB (log)", Dots: true}
	for _, r := range rows[1:] {
		base := empty.settled.rss
		if r.watcher != "exit-guard" {
			base = 0
		}
		ready.Lines = append(ready.Lines, figure.Line{Name: r.watcher, Y: []float64{r.ready.Seconds()}})
		peak.Lines = append(peak.Lines, figure.Line{Name: r.watcher, Y: []float64{float64(r.at.peak) / (1 << 20)}})
		perWorkflow.Lines = append(perWorkflow.Lines, figure.Line{Name: r.watcher, Y: []float64{(float64(r.settled.rss) - float64(base)) / float64(r.workflows) / 1000}})
	}
	return figure.Write(*plotPath, "", nil, true, ready, peak, perWorkflow)
}

// checkGuard asks the API server, through the guard, about two exit handlers: that of a
// retained Succeeded workflow must be refused, that of a running one admitted.
func checkGuard(ctx context.Context, p *process, cl client.Client, workflows int) error {
	wf := &argo.Workflow{}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "retained", Name: "wf-0"}, wf); err != nil {
		return err
	}
	err := cl.Create(ctx, fixture.ExitPod(wf), client.DryRunAll)
	switch {
	case err == nil:
		return errors.New("the exit handler of a Succeeded workflow was admitted after the restart")
	case !contract.IsRefusal(err):
		return fmt.Errorf("the exit handler of a Succeeded workflow was not refused by the guard after the restart: %w", err)
	}
	running := retainedWorkflow("retained", fmt.Sprintf("running-%d", time.Now().UnixNano()), 1000)
	fixture.MarkPhase(running, argo.PhaseRunning)
	if err := cl.Create(ctx, running); err != nil {
		return err
	}
	if err := cl.Create(ctx, fixture.ExitPod(running), client.DryRunAll); err != nil {
		return fmt.Errorf("the exit handler of a running workflow was refused: %w", err)
	}
	got, err := scrapeLabelled(ctx, "http://"+p.metricsAddr+"/metrics", `exit_guard_store_records{state="terminal"}`)
	if err != nil {
		return err
	}
	if int(got) < workflows {
		return fmt.Errorf("the guard's store holds %v terminal workflows once Ready, want %d", got, workflows)
	}
	return nil
}

// fastClient is a client of env's API server without client-side rate limits.
func fastClient(env *testenv.Env) (client.Client, error) {
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	return client.New(cfg, client.Options{Scheme: env.Scheme})
}

// scrapeLabelled reads one series, written as in the text format (name{labels}), from a
// Prometheus endpoint.
func scrapeLabelled(ctx context.Context, url, series string) (float64, error) {
	body, err := get(ctx, url)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			_, err := fmt.Sscan(v, &f)
			return f, err
		}
	}
	return 0, errors.New(series + " not served")
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// listMetadata times a paginated, consistent metadata-only LIST of the workflows of namespace
// (pages of 500, read from etcd): what a first list costs the API server. An informer may list
// from the watch cache (resourceVersion 0) instead, which this does not time.
func listMetadata(ctx context.Context, cl client.Client, namespace string) (time.Duration, error) {
	start := time.Now()
	cont := ""
	for {
		l := &metav1.PartialObjectMetadataList{}
		l.SetGroupVersionKind(argo.GroupVersion.WithKind("WorkflowList"))
		if err := cl.List(ctx, l, client.InNamespace(namespace), client.Limit(500), client.Continue(cont)); err != nil {
			return 0, err
		}
		if cont = l.GetContinue(); cont == "" {
			return time.Since(start), nil
		}
	}
}

// median is the middle of ds (the lower of the two middles).
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// durations lists ds, rounded to the millisecond.
func durations(ds []time.Duration) string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Round(time.Millisecond).String())
	}
	return strings.Join(out, ", ")
}

// dirSize is the bytes of the files under dir (0 when it cannot be read).
func dirSize(dir string) int64 {
	var n int64
	if dir == "" {
		return 0
	}
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
