package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// runWatch measures the CPU each watcher spends to absorb a burst of updates of large
// workflows: every workflow is written again and again, as Argo's controller writes a running
// workflow's whole object on each reconcile, and its last write completes it. The watchers run
// side by side in their own processes; each one's CPU is read from /proc before the burst and
// once its watch has reached the burst's last write.
func runWatch(args []string) error {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	var c common
	c.register(fs, 20*time.Minute)
	n := fs.Int("workflows", 20, "Workflows written in the burst.")
	size := fs.Int("size-kb", 1000, "Size of each workflow, in KB of JSON.")
	writes := fs.Int("writes", 10, "Writes of each workflow in the burst (the last one completes it).")
	watchers := fs.String("watchers", "exit-guard,"+shapePhase+","+shapeFull, "The watchers measured.")
	idleFor := fs.Duration("idle", 10*time.Second, "How long each watcher's idle CPU is measured before the burst.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *writes < 1 || *idleFor <= 0 {
		return fmt.Errorf("--writes must be at least 1 and --idle positive")
	}
	ctx, cancel, err := c.context()
	if err != nil {
		return err
	}
	defer cancel()
	env, cl, err := startAPIServer(true)
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	fmt.Fprintf(os.Stderr, "creating %d running workflows of %d KB\n", *n, *size)
	wfs := make([]*unstructured.Unstructured, *n)
	for i := range wfs {
		wf := retainedWorkflow("burst", fmt.Sprintf("wf-%d", i), *size*1000)
		fixture.MarkPhase(wf, argo.PhaseRunning)
		if i == 0 {
			if err := cl.Create(ctx, namespace("burst")); err != nil {
				return err
			}
		}
		if err := cl.Create(ctx, wf); err != nil {
			return err
		}
		wfs[i] = wf
	}

	var procs []*process
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for _, w := range strings.Split(*watchers, ",") {
		var p *process
		if w == "exit-guard" {
			p, err = startGuard(c.guard, env, env.WebhookPort)
		} else {
			p, err = startWatcher(w, env.KubeConfig())
		}
		if err != nil {
			return err
		}
		procs = append(procs, p)
	}
	for _, p := range procs {
		if _, err := p.waitReady(ctx); err != nil {
			return err
		}
	}
	time.Sleep(3 * time.Second) // let the start-up work end before the count
	// What each watcher spends idle (timers, metrics, garbage collection), to take out of
	// what the burst costs it.
	idle := *idleFor
	idleCPU := make([]time.Duration, len(procs))
	for i, p := range procs {
		if idleCPU[i], err = p.CPU(); err != nil {
			return err
		}
	}
	time.Sleep(idle)
	// What asking a watcher how far it got costs it (the guard renders all its metrics), to
	// take out of the burst's count as well.
	const asks = 50
	askCPU := make([]time.Duration, len(procs))
	for i, p := range procs {
		t0, err := p.CPU()
		if err != nil {
			return err
		}
		for range asks {
			if _, err := p.rv(ctx); err != nil {
				return err
			}
		}
		t1, err := p.CPU()
		if err != nil {
			return err
		}
		askCPU[i] = (t1 - t0) / asks
	}
	before := make([]time.Duration, len(procs))
	for i, p := range procs {
		if before[i], err = p.CPU(); err != nil {
			return err
		}
		idleCPU[i] = before[i] - idleCPU[i] - asks*askCPU[i]
	}

	fmt.Fprintf(os.Stderr, "burst: %d writes of each workflow\n", *writes)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(wfs))
	for _, wf := range wfs {
		wg.Go(func() {
			for k := range *writes {
				status := wf.Object["status"].(map[string]any)
				for _, node := range status["nodes"].(map[string]any) {
					node.(map[string]any)["message"] = "write " + strconv.Itoa(k)
					break
				}
				if k == *writes-1 {
					fixture.MarkPhase(wf, argo.PhaseSucceeded)
				}
				if err := cl.Update(ctx, wf); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	wrote := time.Since(start)
	var last uint64
	for _, wf := range wfs {
		if v, _ := strconv.ParseUint(wf.GetResourceVersion(), 10, 64); v > last {
			last = v
		}
	}
	type row struct {
		name   string
		cpu    time.Duration // idle CPU taken out
		idle   time.Duration
		caught time.Duration
	}
	rows := make([]row, len(procs))
	// Asked only once the writes are done, and every 250 ms, so that asking costs little.
	for i, p := range procs {
		asked, err := p.waitRVEvery(ctx, last, 250*time.Millisecond)
		if err != nil {
			return err
		}
		after, err := p.CPU()
		if err != nil {
			return err
		}
		caught := time.Since(start)
		idleShare := time.Duration(float64(idleCPU[i]) * float64(caught) / float64(idle))
		taken := idleShare + time.Duration(asked)*askCPU[i]
		rows[i] = row{name: p.name, cpu: after - before[i] - taken, idle: taken, caught: caught}
	}
	for _, p := range procs {
		if p.name != "exit-guard" {
			continue
		}
		got, err := scrapeLabelled(ctx, "http://"+p.metricsAddr+"/metrics", `exit_guard_store_records{state="terminal"}`)
		if err != nil {
			return err
		}
		if int(got) != *n {
			return fmt.Errorf("after the burst the guard's store holds %v completed workflows, want %d", got, *n)
		}
	}
	total := *n * *writes
	fmt.Printf("\n%d writes (%d workflows of %d KB, %d writes each) in %s; CPU of each watcher's process from /proc, from before the burst until its watch reached the last write, less what it spent idle over as long (measured over %s before the burst) and what being asked how far it got cost it (measured too); asked every 250 ms once the writes were done.\n\n",
		total, *n, *size, *writes, wrote.Round(time.Millisecond), idle)
	fmt.Println("| watcher | CPU for the burst | idle and asking CPU taken out | CPU per write | caught up after | CPU / exit-guard's |")
	fmt.Println("|---|---|---|---|---|---|")
	var guardCPU time.Duration
	for _, r := range rows {
		if r.name == "exit-guard" {
			guardCPU = r.cpu
		}
	}
	for _, r := range rows {
		ratio := "-"
		if guardCPU > 0 {
			ratio = fmt.Sprintf("%.1f", float64(r.cpu)/float64(guardCPU))
		}
		fmt.Printf("| %s | %s | %s | %.2f ms | %s | %s |\n", r.name, r.cpu.Round(time.Millisecond), r.idle.Round(time.Millisecond),
			float64(r.cpu.Microseconds())/1000/float64(total), r.caught.Round(time.Millisecond), ratio)
	}
	return nil
}

func namespace(name string) client.Object {
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetName(name)
	return ns
}
