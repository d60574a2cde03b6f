package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// runWebhook drives the guard's webhook alone, over TLS on loopback, at fixed rates (open
// loop: each request leaves at its time whatever the answers before it, and its latency counts
// from that time), with pods as Argo makes them. Three kinds of decision: a pod the policy
// does not cover (a step pod), an exit handler decided store-first, an exit handler decided by
// a live read. CPU is the guard process's own, read from /proc.
func runWebhook(args []string) error {
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	var c common
	c.register(fs, 30*time.Minute)
	ratesFlag := fs.String("rates", "500,1000,2000", "Admissions per second, comma-separated.")
	liveRates := fs.String("live-read-rates", "100,500,1000", "Rates of the live-read decisions (each one also reads from the API server).")
	duration := fs.Duration("duration", 10*time.Second, "How long each rate is held.")
	inFlight := fs.Int("max-in-flight", 256, "Requests in flight at most; a request that finds no room counts as an error.")
	nSlices := fs.Int("slices", 5, "Each rate's time is cut into this many slices; each slice drives every webhook in turn, in a random order, so that noise hits them alike.")
	loadRate := fs.Float64("under-load-rate", 200, "Rate of the live-read decisions measured with the API server idle, then loaded.")
	loadWorkflows := fs.Int("load-workflows", 2000, "Workflows (30 KB each) that the background load lists whole, again and again.")
	loadWorkers := fs.Int("load-workers", 6, "Clients of the background load, each listing every workflow and writing one.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rates, err := parseRates(*ratesFlag)
	if err != nil {
		return err
	}
	lrates, err := parseRates(*liveRates)
	if err != nil {
		return err
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
	pods, err := loadPodTemplates()
	if err != nil {
		return err
	}
	wf := retainedWorkflow("load", "running", 30000)
	fixture.MarkPhase(wf, argo.PhaseRunning)
	if err := cl.Create(ctx, namespace("load")); err != nil {
		return err
	}
	if err := cl.Create(ctx, wf); err != nil {
		return err
	}
	done := retainedWorkflow("load", "succeeded", 30000)
	if err := cl.Create(ctx, done); err != nil {
		return err
	}

	type target struct {
		name  string
		proc  *process
		port  int
		pod   *corev1.Pod
		rates []float64
		// guard: the target is exit-guard (not a floor).
		guard bool
	}
	var targets []target
	allRates := append(slices.Clone(rates), lrates...)
	slices.Sort(allRates)
	allRates = slices.Compact(allRates)
	for _, t := range []struct {
		name  string
		floor string // the floor's kind; empty: exit-guard with args
		args  []string
		pod   *corev1.Pod
		rates []float64
	}{
		{"do-nothing webhook (net/http), exit handler", floorHTTP, nil, podFor(&pods.exit, wf), allRates},
		{"do-nothing webhook (controller-runtime), exit handler", floorRuntime, nil, podFor(&pods.exit, wf), allRates},
		{"pod not covered (step, --cover=exit-handlers)", "", []string{"--cover=exit-handlers"}, podFor(&pods.step, wf), rates},
		{"step pod (covered, store-first)", "", nil, podFor(&pods.step, wf), rates},
		{"exit handler, --store-first", "", []string{"--store-first"}, podFor(&pods.exit, wf), rates},
		{"exit handler, live read", "", nil, podFor(&pods.exit, wf), lrates},
	} {
		port, err := testenv.FreePort()
		if err != nil {
			return err
		}
		var p *process
		if t.floor != "" {
			p, err = startFloor(env, t.floor, port)
		} else {
			p, err = startGuard(c.guard, env, port, t.args...)
		}
		if err != nil {
			return err
		}
		defer p.stop()
		if _, err := p.waitReady(ctx); err != nil {
			return err
		}
		targets = append(targets, target{name: t.name, proc: p, port: port, pod: t.pod, rates: t.rates, guard: t.floor == ""})
	}
	live := targets[len(targets)-1]

	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(env.WebhookCAData) {
		return errors.New("the webhook CA is not PEM")
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: *inFlight, MaxConnsPerHost: *inFlight,
	}}
	// The guard must refuse the exit handler of the Succeeded workflow on each port that
	// covers exit handlers, before anything is measured.
	for _, t := range targets {
		if !t.guard || strings.HasPrefix(t.name, "pod not covered") {
			continue
		}
		allowed, err := review(ctx, hc, t.port, env, mustReview(podFor(&pods.exit, done)))
		if err != nil {
			return err
		}
		if allowed {
			return fmt.Errorf("%s: the exit handler of a Succeeded workflow was admitted", t.name)
		}
	}

	size := podSize(podFor(&pods.step, wf))
	exitSize := podSize(podFor(&pods.exit, wf))
	fmt.Printf("\nThe guard's webhook alone, and two webhooks that admit everything (the floor), over TLS (HTTP/1.1) on loopback, open loop at fixed rates for %s each, cut into %d slices that drive every webhook in turn in a random order; pods of %.1f to %.1f KB as Argo v3.4.17 makes them (with env and volumes); the load generator shares the 2 cores. Latency from each request's scheduled time to its answer; CPU is the webhook process's own.\n\n",
		*duration, *nSlices, float64(min(size, exitSize))/1000, float64(max(size, exitSize))/1000)
	fmt.Println("| decision | rate (/s) | sent | errors | p50 | p99 | p99.9 | webhook CPU per admission | p50 / net/http floor | p99 / net/http floor | CPU / net/http floor | CPU / controller-runtime floor |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	type result struct {
		lat  []time.Duration
		errs int
		cpu  time.Duration
	}
	slice := *duration / time.Duration(*nSlices)
	for _, rate := range allRates {
		var here []target
		for _, t := range targets {
			if slices.Contains(t.rates, rate) {
				here = append(here, t)
			}
		}
		res := make([]result, len(here))
		order := make([]int, len(here))
		for i := range order {
			order[i] = i
		}
		for range *nSlices {
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] }) //nolint:gosec // G404: an order of webhooks, not a secret
			for _, i := range order {
				t := here[i]
				cpu0, err := t.proc.CPU()
				if err != nil {
					return err
				}
				lat, errs, err := drive(ctx, hc, t.port, env, mustReview(t.pod), rate, slice, *inFlight)
				if err != nil {
					return err
				}
				cpu1, err := t.proc.CPU()
				if err != nil {
					return err
				}
				res[i].lat, res[i].errs, res[i].cpu = append(res[i].lat, lat...), res[i].errs+errs, res[i].cpu+cpu1-cpu0
			}
		}
		per := func(r result) time.Duration {
			if n := len(r.lat) + r.errs; n > 0 {
				return r.cpu / time.Duration(n)
			}
			return 0
		}
		// here[0] and here[1] are the floors: they run at every rate.
		fq, fcpu, rcpu := quantiles(res[0].lat), per(res[0]), per(res[1])
		for i, t := range here {
			q, cpu := quantiles(res[i].lat), per(res[i])
			fmt.Printf("| %s | %.0f | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", t.name, rate, len(res[i].lat)+res[i].errs, res[i].errs,
				ms(q[0]), ms(q[1]), ms(q[2]), us(cpu), ratio(float64(q[0]), float64(fq[0])), ratio(float64(q[1]), float64(fq[1])),
				ratio(float64(cpu), float64(fcpu)), ratio(float64(cpu), float64(rcpu)))
		}
	}

	// The live read with the API server idle, then loaded by clients that list every
	// workflow whole and write them.
	fmt.Fprintf(os.Stderr, "creating %d workflows for the background load\n", *loadWorkflows)
	if _, _, err := createRetained(ctx, cl, "bulk", 0, *loadWorkflows, sizes{size: 30000}, nil); err != nil {
		return err
	}
	fmt.Printf("\nThe live read with the API server idle, then loaded by %d clients that each list %d workflows of 30 KB whole (no pagination) and write one, again and again; exit handlers at %.0f/s for %s.\n\n",
		*loadWorkers, *loadWorkflows, *loadRate, *duration)
	fmt.Println("| API server | decisions | errors | p50 | p99 | p99.9 | decided by the store (live read failed or timed out) | further attempts (retries, hedges) |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	body := mustReview(live.pod)
	for _, loaded := range []bool{false, true} {
		stopLoad := func() {}
		if loaded {
			stopLoad = backgroundLoad(ctx, cl, *loadWorkers)
		}
		fb0, at0 := liveReadCounters(ctx, live.proc)
		lat, errs, err := drive(ctx, hc, live.port, env, body, *loadRate, *duration, *inFlight)
		stopLoad()
		if err != nil {
			return err
		}
		fb1, at1 := liveReadCounters(ctx, live.proc)
		n := len(lat) + errs
		q := quantiles(lat)
		fmt.Printf("| %s | %d | %d | %s | %s | %s | %.0f (%.1f%%) | %.0f |\n", map[bool]string{false: "idle", true: "loaded"}[loaded],
			n, errs, ms(q[0]), ms(q[1]), ms(q[2]), fb1-fb0, 100*(fb1-fb0)/float64(n), at1-at0)
	}
	return nil
}

// liveReadCounters reads the guard's count of live reads the store decided instead, and of
// further attempts.
func liveReadCounters(ctx context.Context, p *process) (fallbacks, attempts float64) {
	url := "http://" + p.metricsAddr + "/metrics"
	for _, k := range []string{"timeout", "error"} {
		v, _ := scrapeLabelled(ctx, url, `exit_guard_live_read_failures_total{kind="`+k+`"}`)
		fallbacks += v
	}
	for _, k := range []string{"error", "hedged", "shed", "get-beside-list"} {
		v, _ := scrapeLabelled(ctx, url, `exit_guard_live_read_retries_total{cause="`+k+`"}`)
		attempts += v
	}
	return fallbacks, attempts
}

// backgroundLoad starts workers that list the bulk namespace's workflows whole and write one
// of them, until the returned function is called.
func backgroundLoad(ctx context.Context, cl client.Client, workers int) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				list := &unstructured.UnstructuredList{}
				list.SetGroupVersionKind(argo.WorkflowListGVK)
				_ = cl.List(ctx, list, client.InNamespace("bulk"))
				if len(list.Items) > 0 {
					wf := &list.Items[(w*7919+i)%len(list.Items)]
					wf.SetAnnotations(map[string]string{"load": strconv.Itoa(i)})
					_ = cl.Update(ctx, wf)
				}
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 {
			return nil, fmt.Errorf("%q is not a list of rates", s)
		}
		out = append(out, r)
	}
	return out, nil
}

func mustReview(p *corev1.Pod) []byte {
	raw, _ := json.Marshal(p)
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("load"),
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: p.Namespace, Name: p.Name, Operation: admissionv1.Create,
			Object: runtime.RawExtension{Raw: raw},
		},
	}
	body, _ := json.Marshal(review)
	return body
}

// review posts one AdmissionReview and says whether the guard admitted the pod.
func review(ctx context.Context, hc *http.Client, port int, env *testenv.Env, body []byte) (bool, error) {
	url := "https://" + env.WebhookHost + ":" + strconv.Itoa(port) + "/validate-pod"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return false, err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, err
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("%s: %s", resp.Status, raw)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(raw, &out); err != nil || out.Response == nil {
		return false, fmt.Errorf("not an AdmissionReview: %q", raw)
	}
	return out.Response.Allowed, nil
}

// drive sends body at rate per second for d and returns the latency of each admitted answer
// and the count of errors (failed requests, refusals, no room in flight).
func drive(ctx context.Context, hc *http.Client, port int, env *testenv.Env, body []byte, rate float64, d time.Duration, inFlight int) ([]time.Duration, int, error) {
	n := int(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	sem := make(chan struct{}, inFlight)
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	errs := 0
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait)
		}
		if ctx.Err() != nil {
			return nil, 0, errTimeout
		}
		select {
		case sem <- struct{}{}:
		default:
			mu.Lock()
			errs++
			mu.Unlock()
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			allowed, err := review(ctx, hc, port, env, body)
			took := time.Since(at)
			mu.Lock()
			defer mu.Unlock()
			if err != nil || !allowed {
				errs++
				if errs == 1 {
					fmt.Fprintf(os.Stderr, "  first error at %.0f/s: allowed %v, %v\n", rate, allowed, err)
				}
				return
			}
			lat = append(lat, took)
		})
	}
	wg.Wait()
	return lat, errs, nil
}
