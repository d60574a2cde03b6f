package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// The columns of the roles run: the floor, and the guard as one replica and as two behind a
// round-robin TCP relay (as a Service spreads connections over the chart's two replicas).
const (
	rolesFloor = "do-nothing webhook (controller-runtime)"
	rolesOne   = "exit-guard, one replica"
	rolesTwo   = "exit-guard, two replicas"
)

var rolesColumns = []string{rolesFloor, rolesOne, rolesTwo}

// A role is a write Argo sends that the chart's webhooks judge, made for a running workflow.
type role struct {
	name string
	// webhook: "pod" or "taskset", the chart's webhook it reaches.
	webhook string
	object  func(owner *unstructured.Unstructured) client.Object
}

func rolesOf(pods *podTemplates) []role {
	return []role{
		{"step pod", "pod", func(o *unstructured.Unstructured) client.Object { return podFor(&pods.step, o) }},
		{"exit-handler pod", "pod", func(o *unstructured.Unstructured) client.Object { return podFor(&pods.exit, o) }},
		{"hook pod", "pod", func(o *unstructured.Unstructured) client.Object { return hookPod(&pods.step, o) }},
		{"agent pod", "pod", func(o *unstructured.Unstructured) client.Object { return fixture.AgentPod(o) }},
		{"TaskSet create", "taskset", func(o *unstructured.Unstructured) client.Object {
			key, tmpl := fixture.OnExitTask(o)
			return fixture.TaskSet(o, map[string]any{key: tmpl})
		}},
	}
}

// runRoles creates each role's write (server-side dry runs) of a running workflow through the
// API server, for each column, interleaved in a random order, at growing numbers of retained
// Succeeded workflows; it reads what the API server itself measured of each webhook call
// (apiserver_admission_webhook_admission_duration_seconds: the calls and their mean), the
// latency its client saw, and the CPU the webhook's processes spent per call.
func runRoles(args []string) error {
	fs := flag.NewFlagSet("roles", flag.ContinueOnError)
	var c common
	c.register(fs, 60*time.Minute)
	sizesFlag := fs.String("retained", "0,10000,100000", "Retained Succeeded workflows at each step, comma-separated, growing.")
	size := fs.Int("size", 4000, "Bytes of JSON of each retained workflow.")
	rounds := fs.Int("rounds", 1000, "Writes of each role per column at each step.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	steps, err := parseRetained(*sizesFlag)
	if err != nil {
		return err
	}
	ctx, cancel, err := c.context()
	if err != nil {
		return err
	}
	defer cancel()
	helm, err := testenv.HelmBin()
	if err != nil {
		return err
	}
	chart, err := testenv.ChartWebhook(helm)
	if err != nil {
		return err
	}
	env, cl, err := startAPIServer(false)
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	pods, err := loadPodTemplates()
	if err != nil {
		return err
	}
	roles := rolesOf(pods)

	owners := map[string]*unstructured.Unstructured{}
	for _, col := range rolesColumns {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rolesNamespace(col), Labels: map[string]string{"column": rolesNamespace(col)}}}
		if err := cl.Create(ctx, ns); err != nil {
			return err
		}
		wf := retainedWorkflow(ns.Name, "running", 2000)
		fixture.MarkPhase(wf, argo.PhaseRunning)
		if err := cl.Create(ctx, wf); err != nil {
			return err
		}
		owners[col] = wf
	}

	// Each column's processes: one floor, one guard, two guards behind a relay.
	var procs []*process
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	procsOf := map[string][]*process{}
	var guards []*process
	for _, col := range rolesColumns {
		port, err := testenv.FreePort()
		if err != nil {
			return err
		}
		var ps []*process
		switch col {
		case rolesFloor:
			p, err := startFloor(env, floorRuntime, port)
			if err != nil {
				return err
			}
			ps = append(ps, p)
		case rolesOne:
			p, err := startGuard(c.guard, env, port)
			if err != nil {
				return err
			}
			ps = append(ps, p)
		case rolesTwo:
			var backends []string
			for range 2 {
				bport, err := testenv.FreePort()
				if err != nil {
					return err
				}
				p, err := startGuard(c.guard, env, bport)
				if err != nil {
					return err
				}
				ps = append(ps, p)
				backends = append(backends, net.JoinHostPort(env.WebhookHost, strconv.Itoa(bport)))
			}
			relay, err := startRoundRobin(net.JoinHostPort(env.WebhookHost, strconv.Itoa(port)), backends)
			if err != nil {
				return err
			}
			defer relay.Close()
		}
		for _, p := range ps {
			p.name = col
			procs = append(procs, p)
			if _, err := p.waitReady(ctx); err != nil {
				return err
			}
			if col != rolesFloor {
				guards = append(guards, p)
			}
		}
		procsOf[col] = ps
		if err := cl.Create(ctx, rolesWebhooks(chart, env, col, port)); err != nil {
			return err
		}
	}
	// A webhook configuration applies a moment after it is created: wait until the API server
	// calls each column's webhooks.
	for _, col := range rolesColumns {
		for _, r := range roles {
			if err := waitHookCalled(ctx, env, cl, rolesHookName(col, r.webhook), r.object(owners[col])); err != nil {
				return fmt.Errorf("%s, %s: %w", col, r.name, err)
			}
		}
	}

	fmt.Printf("Writes of a running workflow (server-side dry runs) through kube-apiserver, each role in turn, the columns interleaved in a random order each round; %d writes of each role per column at each step. Retained workflows are Succeeded, %d KB each, in a namespace of their own. \"API server's mean call\" is apiserver_admission_webhook_admission_duration_seconds (its sum over its count) for the column's webhook; \"create\" the latency the API server's client saw; CPU is the webhook's processes' own (both replicas' for two), per call.\n",
		*rounds, *size/1000)
	retained := 0
	for _, step := range steps {
		fmt.Fprintf(os.Stderr, "retaining %d workflows\n", step)
		_, rv, err := createRetained(ctx, cl, "retained", retained, step, sizes{size: *size}, nil)
		if err != nil {
			return err
		}
		retained = step
		for _, p := range guards {
			if err := p.waitRV(ctx, rv); err != nil {
				return err
			}
		}
		fmt.Printf("\n**%d retained workflows**\n\n", step)
		fmt.Println("| role | webhook | calls | API server's mean call | / do-nothing | create p50 | p99 | p99.9 | webhook CPU per call | / do-nothing |")
		fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
		for _, r := range roles {
			res, err := measureRole(ctx, env, cl, r, owners, procsOf, *rounds)
			if err != nil {
				return fmt.Errorf("%d retained workflows, %s: %w", step, r.name, err)
			}
			floor := res[rolesFloor]
			for _, col := range rolesColumns {
				m := res[col]
				q := quantiles(m.latency)
				fmt.Printf("| %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s |\n", r.name, col, m.calls, ms(m.mean), ratio(float64(m.mean), float64(floor.mean)),
					ms(q[0]), ms(q[1]), ms(q[2]), us(m.cpuPerCall), ratio(float64(m.cpuPerCall), float64(floor.cpuPerCall)))
			}
		}
		for _, p := range guards {
			mem, err := p.memory()
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "  %s: RSS %d MiB, peak %d MiB\n", p.name, mem.rss>>20, mem.peak>>20)
		}
	}
	return nil
}

// roleResult is what one role's writes measured for one column.
type roleResult struct {
	calls      float64
	mean       time.Duration
	latency    []time.Duration
	cpuPerCall time.Duration
}

// measureRole sends rounds writes of r to each column, interleaved, and checks that the API
// server called each column's webhook once for each and that none was refused.
func measureRole(ctx context.Context, env *testenv.Env, cl client.Client, r role, owners map[string]*unstructured.Unstructured, procsOf map[string][]*process, rounds int) (map[string]roleResult, error) {
	type reading struct {
		count, sum float64
		cpu        time.Duration
	}
	read := func() (map[string]reading, error) {
		mfs, err := env.APIServerMetrics(ctx)
		if err != nil {
			return nil, err
		}
		out := map[string]reading{}
		for _, col := range rolesColumns {
			var rd reading
			if mf := mfs["apiserver_admission_webhook_admission_duration_seconds"]; mf != nil {
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "name" && l.GetValue() == rolesHookName(col, r.webhook) {
							rd.count += float64(m.GetHistogram().GetSampleCount())
							rd.sum += m.GetHistogram().GetSampleSum()
						}
					}
				}
			}
			for _, p := range procsOf[col] {
				cpu, err := p.CPU()
				if err != nil {
					return nil, err
				}
				rd.cpu += cpu
			}
			out[col] = rd
		}
		return out, nil
	}
	before, err := read()
	if err != nil {
		return nil, err
	}
	lat := map[string][]time.Duration{}
	order := slices.Clone(rolesColumns)
	for range rounds {
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] }) //nolint:gosec // G404: an order of columns, not a secret
		for _, col := range order {
			o := r.object(owners[col])
			start := time.Now()
			err := cl.Create(ctx, o, client.DryRunAll)
			d := time.Since(start)
			if err != nil {
				return nil, fmt.Errorf("%s refused the %s of a running workflow: %w", col, r.name, err)
			}
			lat[col] = append(lat[col], d)
		}
		if ctx.Err() != nil {
			return nil, errTimeout
		}
	}
	after, err := read()
	if err != nil {
		return nil, err
	}
	res := map[string]roleResult{}
	for _, col := range rolesColumns {
		calls := after[col].count - before[col].count
		if calls != float64(rounds) {
			return nil, fmt.Errorf("%s: the API server called the webhook %.0f times for %d writes", col, calls, rounds)
		}
		res[col] = roleResult{calls: calls, latency: lat[col],
			mean:       time.Duration((after[col].sum - before[col].sum) / calls * float64(time.Second)),
			cpuPerCall: (after[col].cpu - before[col].cpu) / time.Duration(rounds)}
	}
	return res, nil
}

func rolesNamespace(col string) string {
	return "roles-" + strconv.Itoa(slices.Index(rolesColumns, col))
}

// rolesHookName is the name of col's webhook of kind ("pod" or "taskset").
func rolesHookName(col, kind string) string {
	return kind + "." + rolesNamespace(col) + ".load.exit-guard.io"
}

// rolesWebhooks is the chart's pod and TaskSet webhooks, named for col, sent to port and only
// for col's namespace.
func rolesWebhooks(chart *admissionregistrationv1.ValidatingWebhookConfiguration, env *testenv.Env, col string, port int) *admissionregistrationv1.ValidatingWebhookConfiguration {
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: rolesNamespace(col)}}
	for _, w := range chart.Webhooks {
		var kind string
		switch {
		case len(w.Rules) > 0 && slices.Contains(w.Rules[0].Resources, "pods"):
			kind = "pod"
		case len(w.Rules) > 0 && slices.Contains(w.Rules[0].Resources, "workflowtasksets"):
			kind = "taskset"
		default:
			continue
		}
		w := *w.DeepCopy()
		path := ""
		if w.ClientConfig.Service != nil && w.ClientConfig.Service.Path != nil {
			path = *w.ClientConfig.Service.Path
		}
		url := "https://" + net.JoinHostPort(env.WebhookHost, strconv.Itoa(port)) + path
		w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: env.WebhookCAData}
		w.Name = rolesHookName(col, kind)
		w.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"column": rolesNamespace(col)}}
		vwc.Webhooks = append(vwc.Webhooks, w)
	}
	return vwc
}

// waitHookCalled creates o (dry run) until the API server has called the webhook named name for
// it: a webhook that admits everything tells nothing by its answer.
func waitHookCalled(ctx context.Context, env *testenv.Env, cl client.Client, name string, o client.Object) error {
	deadline := time.Now().Add(time.Minute)
	for {
		before, err := env.APIServerCounter(ctx, "apiserver_admission_webhook_request_total", map[string]string{"name": name})
		if err != nil {
			return err
		}
		if err := cl.Create(ctx, o.DeepCopyObject().(client.Object), client.DryRunAll); err != nil {
			return fmt.Errorf("refused: %w", err)
		}
		after, err := env.APIServerCounter(ctx, "apiserver_admission_webhook_request_total", map[string]string{"name": name})
		if err != nil {
			return err
		}
		if after > before {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the API server still does not call webhook %s a minute after it was registered", name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// roundRobin is a TCP relay that sends each connection it accepts to the next of its backends
// in turn, as a Service spreads connections over a Deployment's replicas: TLS passes through.
type roundRobin struct {
	ln   net.Listener
	next atomic.Uint64
}

func startRoundRobin(addr string, backends []string) (*roundRobin, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	rr := &roundRobin{ln: ln}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			backend := backends[(rr.next.Add(1)-1)%uint64(len(backends))]
			go func() {
				defer func() { _ = in.Close() }()
				out, err := net.DialTimeout("tcp", backend, 5*time.Second)
				if err != nil {
					return
				}
				defer func() { _ = out.Close() }()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
				go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return rr, nil
}

// Close stops accepting; the connections it relays end with either side.
func (rr *roundRobin) Close() {
	if err := rr.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		fmt.Fprintln(os.Stderr, "closing the relay:", err)
	}
}
