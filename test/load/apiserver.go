package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/figure"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// The columns of the side-by-side run: each has a namespace of its own, and the policy under
// test selects only that namespace.
const (
	colNone         = "no webhook"
	colFloorHTTP    = "do-nothing webhook (net/http)"
	colFloorRuntime = "do-nothing webhook (controller-runtime)"
	colGuard        = "exit-guard"
	colStoreFirst   = "exit-guard --store-first"
	colLiveGet      = "live-GET peer"
	colVAP          = "ValidatingAdmissionPolicy peer"
)

var columns = []string{colNone, colFloorHTTP, colFloorRuntime, colGuard, colStoreFirst, colLiveGet, colVAP}

// floors are the columns that admit everything: they never refuse, so they are ready once the
// API server calls them.
var floors = map[string]string{colFloorHTTP: floorHTTP, colFloorRuntime: floorRuntime}

func columnNamespace(col string) string {
	return "col-" + strings.NewReplacer(" ", "-", "--", "").Replace(strings.ToLower(strings.Fields(col)[0]+"-"+strconv.Itoa(slices.Index(columns, col))))
}

// runAPIServer creates exit-handler pods (server-side dry runs) through the API server under
// each policy, interleaved, at growing numbers of retained Succeeded workflows, and reports the
// latency the API server's client sees. It also counts, from the API server's own metrics,
// which pods reached the guard's webhook.
func runAPIServer(args []string) error {
	fs := flag.NewFlagSet("apiserver", flag.ContinueOnError)
	var c common
	c.register(fs, 60*time.Minute)
	sizesFlag := fs.String("retained", "0,1000,10000,100000", "Retained Succeeded workflows at each step, comma-separated, growing.")
	rounds := fs.Int("rounds", 2000, "Pod creates per column at each step.")
	plotPath := fs.String("plot", "", "Also draw the latencies against the retained workflows as an SVG at this path.")
	slowBudget := fs.Duration("slow-budget", 60*time.Second, "At each step, a column stops once its creates have taken this long in all.")
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

	// One running workflow per column owns the exit handlers; each column's namespace carries
	// its name as a label for the selectors.
	owners := map[string]*unstructured.Unstructured{}
	for _, col := range columns {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: columnNamespace(col), Labels: map[string]string{"column": columnNamespace(col)}}}
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

	// The policies.
	var procs []*process
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	ports := map[string]int{}
	procOf := map[string]*process{}
	// The guard's two processes first: procs[:2] are waited for at each step.
	for _, col := range []string{colGuard, colStoreFirst, colLiveGet, colFloorHTTP, colFloorRuntime} {
		port, err := testenv.FreePort()
		if err != nil {
			return err
		}
		ports[col] = port
		var p *process
		switch col {
		case colGuard:
			p, err = startGuard(c.guard, env, port)
		case colStoreFirst:
			p, err = startGuard(c.guard, env, port, "--store-first")
		case colLiveGet:
			p, err = startLiveGet(env, port)
		default:
			p, err = startFloor(env, floors[col], port)
		}
		if err != nil {
			return err
		}
		p.name = col
		procs = append(procs, p)
		procOf[col] = p
		if _, err := p.waitReady(ctx); err != nil {
			return err
		}
		if err := cl.Create(ctx, webhookFor(chart, env, col, port)); err != nil {
			return err
		}
	}
	for _, o := range vapPeer(columnNamespace(colVAP)) {
		if err := cl.Create(ctx, o); err != nil {
			return err
		}
	}
	// A policy applies some time after it is created: wait until each column refuses the
	// exit handler of a Succeeded workflow.
	for _, col := range columns[1:] {
		wf := retainedWorkflow(columnNamespace(col), "succeeded", 2000)
		if err := cl.Create(ctx, wf); err != nil {
			return err
		}
		if _, floor := floors[col]; floor {
			err = waitHookCalled(ctx, env, cl, webhookName(col), podFor(&pods.exit, wf))
		} else {
			err = waitRefused(ctx, cl, podFor(&pods.exit, wf))
		}
		if err != nil {
			return fmt.Errorf("%s: %w", col, err)
		}
	}

	fmt.Printf("Exit-handler pod creates (server-side dry run, %d KB pods as Argo makes them) through kube-apiserver, the columns interleaved in a random order each round; %d rounds per step, a column stopped after %s of creates in a step. Retained workflows are Succeeded, small, in the ValidatingAdmissionPolicy's namespace (its binding selects them as params).\n",
		podSize(&pods.exit)/1000, *rounds, *slowBudget)
	retained := 0
	// The quantiles of each column at each step, for the plot.
	drawn := map[string][][3]time.Duration{}
	for _, step := range steps {
		fmt.Fprintf(os.Stderr, "retaining %d workflows\n", step)
		_, rv, err := createRetained(ctx, cl, columnNamespace(colVAP), retained, step, sizes{size: 2000}, nil)
		if err != nil {
			return err
		}
		retained = step
		for _, p := range procs[:2] {
			if err := p.waitRV(ctx, rv); err != nil {
				return err
			}
		}
		lat := map[string][]time.Duration{}
		spent := map[string]time.Duration{}
		errs, timeouts := map[string]int{}, map[string]int{}
		cpu0 := map[string]time.Duration{}
		for col, p := range procOf {
			if cpu0[col], err = p.CPU(); err != nil {
				return err
			}
		}
		order := slices.Clone(columns)
		for range *rounds {
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] }) //nolint:gosec // G404: an order of columns, not a secret
			for _, col := range order {
				if spent[col] > *slowBudget {
					continue
				}
				p := podFor(&pods.exit, owners[col])
				start := time.Now()
				err := cl.Create(ctx, p, client.DryRunAll)
				d := time.Since(start)
				spent[col] += d
				switch {
				case apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || errors.Is(err, context.DeadlineExceeded):
					// No answer within the API server's request timeout: Argo's create
					// fails, as a refusal would, but the policy decided nothing.
					timeouts[col]++
					continue
				case err != nil:
					errs[col]++
					if errs[col] == 1 {
						fmt.Fprintf(os.Stderr, "  %s refused the exit handler of a running workflow: %v\n", col, err)
					}
					continue
				}
				lat[col] = append(lat[col], d)
			}
			if ctx.Err() != nil {
				return errTimeout
			}
		}
		// The CPU of each webhook's process over the step, per create sent to it.
		cpuPer := map[string]time.Duration{}
		for col, p := range procOf {
			cpu1, err := p.CPU()
			if err != nil {
				return err
			}
			if n := len(lat[col]) + errs[col] + timeouts[col]; n > 0 {
				cpuPer[col] = (cpu1 - cpu0[col]) / time.Duration(n)
			}
		}
		fmt.Printf("\n**%d retained workflows**\n\n", step)
		fmt.Println("| policy | creates answered | p50 | p99 | p99.9 | p50 / no webhook | p99 / no webhook | webhook CPU per create | refused wrongly | timed out |")
		fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
		base := quantiles(lat[colNone])
		qs := map[string][3]time.Duration{}
		for _, col := range columns {
			q := quantiles(lat[col])
			qs[col] = q
			drawn[col] = append(drawn[col], q)
			cpu := "-"
			if d, ok := cpuPer[col]; ok {
				cpu = us(d)
			}
			fmt.Printf("| %s | %d | %s | %s | %s | %.2f | %.2f | %s | %d | %d |\n", col, len(lat[col]), ms(q[0]), ms(q[1]), ms(q[2]),
				float64(q[0])/float64(base[0]), float64(q[1])/float64(base[1]), cpu, errs[col], timeouts[col])
		}
		fmt.Printf("\nThe webhooks as ratios to the two floors (%d retained workflows): latency of the create through the API server, and the webhook process's CPU per create.\n\n", step)
		fmt.Println("| webhook | p50 / net/http floor | p99 / net/http floor | p99.9 / net/http floor | CPU / net/http floor | p50 / controller-runtime floor | p99 / controller-runtime floor | p99.9 / controller-runtime floor | CPU / controller-runtime floor |")
		fmt.Println("|---|---|---|---|---|---|---|---|---|")
		for _, col := range []string{colFloorRuntime, colGuard, colStoreFirst, colLiveGet} {
			fmt.Printf("| %s |", col)
			for _, floor := range []string{colFloorHTTP, colFloorRuntime} {
				for i := range 3 {
					fmt.Printf(" %s |", ratio(float64(qs[col][i]), float64(qs[floor][i])))
				}
				fmt.Printf(" %s |", ratio(float64(cpuPer[col]), float64(cpuPer[floor])))
			}
			fmt.Println()
		}
		for col, n := range errs {
			if n > 0 {
				return fmt.Errorf("%s refused %d exit handlers of a running workflow", col, n)
			}
		}
		if err := countUnconcerned(ctx, env, cl, pods, owners[colGuard]); err != nil {
			return err
		}
	}
	return plotAPIServer(*plotPath, steps, columns, drawn)
}

// plotAPIServer draws p50, p99 and p99.9 of each column against the retained workflows, on a
// logarithmic latency axis (a column answered nothing at a step: no point).
func plotAPIServer(path string, steps []int, columns []string, drawn map[string][][3]time.Duration) error {
	ticks := make([]string, len(steps))
	for i, s := range steps {
		ticks[i] = strconv.Itoa(s)
	}
	var panels []figure.Panel
	for qi, name := range []string{"p50", "p99", "p99.9"} {
		pn := figure.Panel{Title: name + " of an exit-handler pod create", YLabel: "ms (log)"}
		for _, col := range columns {
			y := make([]float64, len(steps))
			for i, q := range drawn[col] {
				y[i] = figure.Ms(q[qi])
			}
			pn.Lines = append(pn.Lines, figure.Line{Name: col, Y: y})
		}
		panels = append(panels, pn)
	}
	return figure.Write(path, "retained Succeeded workflows", ticks, true, panels...)
}

// countUnconcerned creates pods the guard's policy does not concern in its column (pods no
// workflow owns), then lifecycle-hook and step pods of a workflow, which it covers by default,
// and reads from the API server's metrics how many reached its webhook, and how many its match
// conditions kept away.
func countUnconcerned(ctx context.Context, env *testenv.Env, cl client.Client, pods *podTemplates, owner *unstructured.Unstructured) error {
	const n = 200
	name := webhookName(colGuard)
	read := func() (calls, excluded float64, err error) {
		if calls, err = env.APIServerCounter(ctx, "apiserver_admission_webhook_request_total", map[string]string{"name": name}); err != nil {
			return 0, 0, err
		}
		excluded, err = env.APIServerCounter(ctx, "apiserver_admission_match_condition_exclusions_total", map[string]string{"name": name})
		return calls, excluded, err
	}
	calls0, excl0, err := read()
	if err != nil {
		return err
	}
	for range n {
		if err := cl.Create(ctx, foreignPod(owner.GetNamespace()), client.DryRunAll); err != nil {
			return err
		}
	}
	calls1, _, err := read()
	if err != nil {
		return err
	}
	for range n {
		if err := cl.Create(ctx, hookPod(&pods.step, owner), client.DryRunAll); err != nil {
			return err
		}
	}
	hookCalls, _, err := read()
	if err != nil {
		return err
	}
	for range n {
		if err := cl.Create(ctx, podFor(&pods.step, owner), client.DryRunAll); err != nil {
			return err
		}
	}
	stepCalls, excl2, err := read()
	if err != nil {
		return err
	}
	fmt.Printf("\nPods in exit-guard's namespace: %d pods no workflow owns, which the policy does not concern: the API server called exit-guard's webhook %.0f times for them (the object selector keeps them away). %d lifecycle-hook pods and %d step pods of a workflow after them (covered by default: hooks read live, steps decided store-first): %.0f and %.0f calls; match conditions excluded %.0f of all these.\n",
		n, calls1-calls0, n, n, hookCalls-calls1, stepCalls-hookCalls, excl2-excl0)
	if calls1 != calls0 || hookCalls-calls1 != n || stepCalls-hookCalls != n || excl2 != excl0 {
		return fmt.Errorf("pods the policy does not concern reached the webhook, covered pods did not, or the counters do not count: foreign pod calls %v, hook pod calls %v, step pod calls %v, exclusions %v",
			calls1-calls0, hookCalls-calls1, stepCalls-hookCalls, excl2-excl0)
	}
	return nil
}

// webhookName is the name of col's pod webhook.
func webhookName(col string) string { return "pod." + columnNamespace(col) + ".load.exit-guard.io" }

// webhookFor is the chart's pod webhook, named for col, sent to port and only for col's
// namespace.
func webhookFor(chart *admissionregistrationv1.ValidatingWebhookConfiguration, env *testenv.Env, col string, port int) *admissionregistrationv1.ValidatingWebhookConfiguration {
	var pod admissionregistrationv1.ValidatingWebhook
	for _, w := range chart.Webhooks {
		if len(w.Rules) > 0 && slices.Contains(w.Rules[0].Resources, "pods") {
			pod = *w.DeepCopy()
		}
	}
	path := "/validate-pod"
	if pod.ClientConfig.Service != nil && pod.ClientConfig.Service.Path != nil {
		path = *pod.ClientConfig.Service.Path
	}
	url := "https://" + env.WebhookHost + ":" + strconv.Itoa(port) + path
	pod.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: env.WebhookCAData}
	pod.Name = webhookName(col)
	pod.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"column": columnNamespace(col)}}
	if col == colLiveGet {
		// The peer is sent every pod of its namespace, as a policy engine's webhook is; it
		// picks the exit handlers itself.
		pod.MatchConditions, pod.ObjectSelector = nil, nil
	}
	return &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: columnNamespace(col)},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{pod}}
}

// vapPeer is the ValidatingAdmissionPolicy peer: Workflows as params, the binding selecting
// those labelled Succeeded in the pod's namespace; an exit handler is refused when any of them
// owns it. The API server evaluates it once per selected workflow.
func vapPeer(ns string) []client.Object {
	fail := admissionregistrationv1.Ignore
	allow := admissionregistrationv1.AllowAction
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "exit-handler-of-succeeded-workflow"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			ParamKind:     &admissionregistrationv1.ParamKind{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind},
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "exit-handler",
				Expression: "has(object.metadata.labels) && 'workflows.argoproj.io/on-exit' in object.metadata.labels"}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "!has(object.metadata.ownerReferences) || !object.metadata.ownerReferences.exists(r, r.kind == 'Workflow' && r.uid == params.metadata.uid)",
				Message:    "the exit handler of a Succeeded workflow",
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "exit-handler-of-succeeded-workflow"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: policy.Name,
			ParamRef: &admissionregistrationv1.ParamRef{
				Selector:                &metav1.LabelSelector{MatchLabels: map[string]string{argo.LabelPhase: string(argo.PhaseSucceeded)}},
				ParameterNotFoundAction: &allow,
			},
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"column": ns}}},
		},
	}
	return []client.Object{policy, binding}
}

// waitRefused creates p (dry run) until the API server refuses it: a new policy takes effect a
// moment after it is created.
func waitRefused(ctx context.Context, cl client.Client, p *corev1.Pod) error {
	deadline := time.Now().Add(time.Minute)
	for {
		p := p.DeepCopy()
		err := cl.Create(ctx, p, client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), "denied") || err != nil && strings.Contains(err.Error(), "forbidden") {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				return errors.New("the exit handler of a Succeeded workflow is still admitted a minute after the policy was created")
			}
			return fmt.Errorf("the exit handler of a Succeeded workflow still gets no refusal a minute after the policy was created: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// quantiles returns p50, p99 and p99.9 of d.
func quantiles(d []time.Duration) [3]time.Duration {
	if len(d) == 0 {
		return [3]time.Duration{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(q*float64(len(s))+0.5) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return [3]time.Duration{at(0.5), at(0.99), at(0.999)}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d.Nanoseconds())/1000) }

// ratio is a/b with two decimals, or "-" when b is 0.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func podSize(p *corev1.Pod) int {
	raw, _ := json.Marshal(p)
	return len(raw)
}

// parseRetained reads --retained: counts of retained workflows, comma-separated, growing.
func parseRetained(flag string) ([]int, error) {
	var steps []int
	for _, f := range strings.Split(flag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || (len(steps) > 0 && n < steps[len(steps)-1]) {
			return nil, fmt.Errorf("--retained: %q is not a growing list of counts", flag)
		}
		steps = append(steps, n)
	}
	return steps, nil
}
