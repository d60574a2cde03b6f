//go:build envtest

package faults

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// The overload runs: an API server of its own with small seat limits, Priority and Fairness
// on (its default), the watch cache on (its default), HTTP/2; the guard authenticated with a
// token of the chart's ServiceAccount, bound to the chart's RBAC (never system:masters, which
// fairness exempts); noisy ServiceAccounts, each a flow of its own in workload-low, looping
// LISTs of large workflows, and Argo's controller's ServiceAccount writing.
const (
	overloadNamespace = "exit-guard" // the guard's release namespace
	noisyFlows        = 16           // noisy ServiceAccounts
	noisyPerFlow      = 14           // LISTs each keeps in flight
	largeWorkflows    = 200          // workflows each noisy LIST reads
	largeWorkflowSize = 40 << 10     // bytes of each
	guardedLabel      = "exit-guard-overload"
	overloadWorkers   = 4   // exit-handler pods in flight
	overloadDefault   = 400 // decisions per run in make test; OVERLOAD_DECISIONS for more
	apiSeatsReadOnly  = "8" // --max-requests-inflight
	apiSeatsMutating  = "4" // --max-mutating-requests-inflight
	noisyTimeout      = 60 * time.Second
)

// overloadRole is the role of the pods each run creates: OVERLOAD_POD_ROLE (exit-handler, the
// default; lifecycle-hook, which reads live within --hook-step-read-budget; step), for the
// waits of each role beside the same flood.
func overloadRole(t *testing.T) func(client.Object) *corev1.Pod {
	t.Helper()
	switch r := os.Getenv("OVERLOAD_POD_ROLE"); r {
	case "", "exit-handler":
		return fixture.ExitPod
	case "lifecycle-hook":
		return fixture.HookPod
	case "step":
		return fixture.StepPod
	default:
		t.Fatalf("OVERLOAD_POD_ROLE=%q: want exit-handler, lifecycle-hook or step", r)
		return nil
	}
}

// overloadDecisions is how many decisions each run makes: OVERLOAD_DECISIONS (make soak sets
// thousands), else overloadDefault.
func overloadDecisions(t *testing.T) int {
	t.Helper()
	if s := os.Getenv("OVERLOAD_DECISIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 200 {
			// Fewer end a run with the FlowSchema in a few seconds: too short to say how long
			// the flood's LISTs waited meanwhile.
			t.Fatalf("OVERLOAD_DECISIONS=%q: want a number of at least 200", s)
		}
		return n
	}
	return overloadDefault
}

// startOverloadedAPIServer starts the API server of the overload runs, with the guard's
// webhook registered (failing closed, for the guarded namespaces only).
func startOverloadedAPIServer(t *testing.T) *testenv.Env {
	t.Helper()
	vwc, err := testenv.GuardWebhook()
	if err != nil {
		t.Fatal(err)
	}
	fail := admissionregistrationv1.Fail
	timeout := int32(10)
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].FailurePolicy = &fail
		vwc.Webhooks[i].TimeoutSeconds = &timeout
		vwc.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{guardedLabel: "true"}}
	}
	e, err := testenv.Start(testenv.Options{
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{vwc},
		APIServerFlags: map[string]string{
			"max-requests-inflight":          apiSeatsReadOnly,
			"max-mutating-requests-inflight": apiSeatsMutating,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	return e
}

// chartObjects renders the chart's ServiceAccount, RBAC and FlowSchema for the release
// exit-guard in overloadNamespace (certificates from the chart: the test serves the webhook
// with envtest's certificate, so the guard needs no rights over it).
func chartObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	helm, err := testenv.HelmBin()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(helm, "template", "exit-guard", filepath.Join(testenv.RepoRoot(), "charts", "exit-guard"), //nolint:gosec // G204: the repository's pinned helm
		"--namespace", overloadNamespace, "--kube-version", testenv.KubeVersion(), "--set", "certificates.mode=chart",
		"--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml", "--show-only", "templates/flowschema.yaml").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(out)), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatal(err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// tokenConfig is a rest config that authenticates with a token of the ServiceAccount
// namespace/name (TokenRequest), straight to the API server: TLS and HTTP/2.
func tokenConfig(t *testing.T, e *testenv.Env, namespace, name string) *rest.Config {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := e.Client.SubResource("token").Create(t.Context(), sa, tr); err != nil {
		t.Fatalf("a token for %s/%s: %v", namespace, name, err)
	}
	return &rest.Config{Host: e.Config.Host, BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.Config.CAData}, QPS: -1}
}

// kubeconfigOf writes cfg (a token config) as a kubeconfig.
func kubeconfigOf(t *testing.T, cfg *rest.Config) []byte {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	out, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// createNamespace makes namespace name, with labels.
func createNamespace(t *testing.T, e *testenv.Env, name string, labels map[string]string) {
	t.Helper()
	if err := e.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}); err != nil {
		t.Fatal(err)
	}
}

// noise is the flood: each noisy ServiceAccount keeps noisyPerFlow LISTs of every large
// workflow in flight, and Argo's controller's ServiceAccount patches them, until stopped. It
// records how long the LISTs took.
type noise struct {
	stop func()
	wg   sync.WaitGroup

	mu       sync.Mutex
	lists    []time.Duration
	failures atomic.Int64
	firstErr atomic.Value // string
	writes   atomic.Int64
}

// startNoise sets up the noisy ServiceAccounts and the large workflows once, and starts the
// flood.
func startNoise(t *testing.T, e *testenv.Env) *noise {
	t.Helper()
	const ns = "noise"
	createNamespace(t, e, ns, nil)
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "noise"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{argo.Group}, Resources: []string{argo.Resource}, Verbs: []string{"get", "list", "watch", "patch"}}}}
	if err := e.Client.Create(t.Context(), role); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "noise"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "noise"}}
	names := []string{"argo-workflows-workflow-controller"}
	for i := range noisyFlows {
		names = append(names, fmt.Sprintf("noisy-%02d", i))
	}
	for _, name := range names {
		if err := e.Client.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name})
	}
	if err := e.Client.Create(t.Context(), binding); err != nil {
		t.Fatal(err)
	}
	payload := strings.Repeat("x", largeWorkflowSize)
	for i := range largeWorkflows {
		wf := fixture.Workflow(ns, fmt.Sprintf("large-%03d", i))
		fixture.MarkPhase(wf, argo.PhaseRunning)
		if err := unstructured.SetNestedField(wf.Object, payload, "spec", "payload"); err != nil {
			t.Fatal(err)
		}
		if err := e.Client.Create(t.Context(), wf); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &noise{stop: cancel}
	list := "/apis/" + argo.Group + "/" + argo.Version + "/namespaces/" + ns + "/" + argo.Resource
	for _, name := range names[1:] {
		hc, err := rest.HTTPClientFor(tokenConfig(t, e, ns, name))
		if err != nil {
			t.Fatal(err)
		}
		for range noisyPerFlow {
			n.wg.Go(func() {
				for ctx.Err() == nil {
					rctx, rcancel := context.WithTimeout(ctx, noisyTimeout)
					start := time.Now()
					err := get(rctx, hc, strings.TrimSuffix(e.Config.Host, "/")+list)
					rcancel()
					if ctx.Err() != nil {
						return
					}
					if err != nil {
						n.failures.Add(1)
						n.firstErr.CompareAndSwap(nil, err.Error())
						select { // a pause before the next try, not past the end
						case <-ctx.Done():
							return
						case <-time.After(50 * time.Millisecond):
						}
						continue
					}
					n.mu.Lock()
					n.lists = append(n.lists, time.Since(start))
					n.mu.Unlock()
				}
			})
		}
	}
	argoCfg := tokenConfig(t, e, ns, names[0])
	argoClient, err := client.New(argoCfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	n.wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			wf := &unstructured.Unstructured{}
			wf.SetGroupVersionKind(argo.WorkflowGVK)
			wf.SetNamespace(ns)
			wf.SetName(fmt.Sprintf("large-%03d", i%largeWorkflows))
			patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"noise":"`+strconv.Itoa(i)+`"}}}`))
			if argoClient.Patch(ctx, wf, patch) == nil {
				n.writes.Add(1)
			}
		}
	})
	t.Cleanup(n.halt)
	return n
}

// get reads url whole and discards it.
func get(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	return nil
}

func (n *noise) halt() {
	n.stop()
	n.wg.Wait()
}

// since returns the LIST latencies recorded from index from on, and the next index.
func (n *noise) since(from int) ([]time.Duration, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.lists[from:]), len(n.lists)
}

// quantile of ds (sorted in place).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// mean of ds.
func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// waitClassifiedBy polls until a read of Workflows as cfg's user is classified by the
// FlowSchema fs.
func waitClassifiedBy(t *testing.T, cfg *rest.Config, fs *unstructured.Unstructured) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := strings.TrimSuffix(cfg.Host, "/") + "/apis/" + argo.Group + "/" + argo.Version + "/namespaces/" + overloadNamespace + "/" + argo.Resource
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID") == string(fs.GetUID()), nil
	}); err != nil {
		t.Fatalf("the guard's reads were never classified by the FlowSchema %s: %v", fs.GetName(), err)
	}
}

// overloadRun is what one run measured.
type overloadRun struct {
	decisions, live, unverified, staleAdmitted, legitRefused, failed int
	// storeRefused are the refusals the store made alone (no live answer within the budget).
	storeRefused int
	latencies    []time.Duration
	noisyLists   []time.Duration
}

// TestLiveReadsUnderPriorityAndFairness floods an API server of small seat limits with
// noisy flows in workload-low until their LISTs wait longer than the guard's whole live-read
// budget, and makes exit-handler pods of a Succeeded workflow (to be refused) and of a Running
// one (to be admitted), without the chart's FlowSchema and with it. It reports the decisions
// made from a live read, their latency, the unverified admissions, the stale pods admitted and
// the legitimate pods refused; it fails if a legitimate pod is refused, or if the flood did not
// make the noisy LISTs wait past the budget (then the run proves nothing).
func TestLiveReadsUnderPriorityAndFairness(t *testing.T) {
	decisions := overloadDecisions(t)
	podOfRole := overloadRole(t)
	e := startOverloadedAPIServer(t)
	createNamespace(t, e, overloadNamespace, nil)
	var flowSchema *unstructured.Unstructured
	for _, o := range chartObjects(t) {
		if o.GetKind() == "FlowSchema" {
			flowSchema = o
			continue
		}
		if err := e.Client.Create(t.Context(), o); err != nil {
			t.Fatalf("creating the chart's %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	if flowSchema == nil {
		t.Fatal("the chart rendered no FlowSchema")
	}
	const guarded = "guarded"
	createNamespace(t, e, guarded, map[string]string{guardedLabel: "true"})
	succeeded := testenv.CreateWorkflow(t, e.Client, guarded, "notify-succeeded", argo.PhaseSucceeded)
	running := testenv.CreateWorkflow(t, e.Client, guarded, "notify-running", argo.PhaseRunning)

	guardCfg := tokenConfig(t, e, overloadNamespace, "exit-guard")
	out := &testenv.Output{}
	// OVERLOAD_GUARD_ARGS: further flags of the guard, to compare settings (a store fallback)
	// under the same flood.
	args := append([]string{"--webhook-port=" + strconv.Itoa(e.WebhookPort), "--webhook-cert-path=" + e.WebhookCertDir, "--lock-check-interval=0s"},
		strings.Fields(os.Getenv("OVERLOAD_GUARD_ARGS"))...)
	t.Logf("the guard's flags: %s", strings.Join(args, " "))
	g, err := testenv.StartGuard(t.Context(), guardBin, kubeconfigOf(t, guardCfg), args, out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { _ = g.Kill() })

	n := startNoise(t, e)
	// The flood takes a while to fill the queues: measure only once it waits past the budget.
	mark := 0
	if err := wait.PollUntilContextTimeout(t.Context(), 2*time.Second, 3*time.Minute, false, func(context.Context) (bool, error) {
		var recent []time.Duration
		recent, mark = n.since(mark)
		return len(recent) >= noisyFlows && quantile(recent, .5) >= 4*time.Second, nil
	}); err != nil {
		t.Fatalf("the noisy LISTs never waited past the guard's budget at the median: the flood is too weak for this machine: %v", err)
	}
	// The guard's default read budget for the role: --live-read-budget for exit handlers,
	// --hook-step-read-budget for hooks and steps. The flood must make the noisy LISTs wait past
	// it, or the run proves nothing.
	budget := 4 * time.Second
	if r := os.Getenv("OVERLOAD_POD_ROLE"); r == "lifecycle-hook" || r == "step" {
		budget = 750 * time.Millisecond
	}
	results := map[bool]overloadRun{}
	for _, with := range []bool{false, true} {
		what := map[bool]string{false: "without the FlowSchema", true: "with the chart's FlowSchema"}[with]
		if with {
			if err := e.Client.Create(t.Context(), flowSchema); err != nil {
				t.Fatal(err)
			}
			// Fairness takes up a new schema from its informer: wait until the guard's reads
			// are classified by it (the API server names the schema in every response).
			waitClassifiedBy(t, guardCfg, flowSchema)
		}
		before, err := g.Metrics(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		_, mark = n.since(mark)
		storeRefusedBefore := len(out.Lines(`"source":"store"`, `"verdict":"denied"`))
		r := overloadRun{}
		var mu sync.Mutex
		var next atomic.Int64
		var wg sync.WaitGroup
		for range overloadWorkers {
			wg.Go(func() {
				for {
					i := next.Add(1)
					if i > int64(decisions) {
						return
					}
					wf, stale := running, false
					if i%2 == 0 {
						wf, stale = succeeded, true
					}
					start := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					err := e.Client.Create(ctx, podOfRole(wf), client.DryRunAll)
					cancel()
					took := time.Since(start)
					mu.Lock()
					r.latencies = append(r.latencies, took)
					switch {
					case err == nil && stale:
						r.staleAdmitted++
					case contract.IsRefusal(err) && !stale:
						r.legitRefused++
					case err != nil && !contract.IsRefusal(err):
						r.failed++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		after, err := g.Metrics(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		delta := func(name string, labels map[string]string) int {
			return int(testenv.SumSeries(after, name, labels) - testenv.SumSeries(before, name, labels))
		}
		r.decisions = decisions
		r.live = delta("exit_guard_live_read_duration_seconds", map[string]string{"result": "found"}) +
			delta("exit_guard_live_read_duration_seconds", map[string]string{"result": "not-found"})
		r.unverified = delta("exit_guard_dry_run_decisions_total", map[string]string{"reason": string(contract.ReasonUnverifiedFailOpen)}) +
			delta("exit_guard_dry_run_decisions_total", map[string]string{"reason": string(contract.ReasonUnconfirmedCompletion)})
		r.storeRefused = len(out.Lines(`"source":"store"`, `"verdict":"denied"`)) - storeRefusedBefore
		r.noisyLists, mark = n.since(mark)
		// The guard's own part of each create: from its receipt of the review to its answer, as
		// its histogram buckets tell (the rest of a create is the API server's queueing and
		// handling).
		role := cmp.Or(os.Getenv("OVERLOAD_POD_ROLE"), "exit-handler")
		guardQ := func(q float64) float64 {
			return testenv.HistogramQuantileBetween(before, after, "exit_guard_decision_duration_seconds", map[string]string{"role": role}, q)
		}
		if timed := delta("exit_guard_decision_duration_seconds", map[string]string{"role": role}); timed != decisions {
			t.Errorf("%s: the guard timed %d decisions of %s pods, want %d", what, timed, role, decisions)
		}
		results[with] = r
		lat := slices.Clone(r.latencies)
		t.Logf("RESULT %s, %s pods: %d decisions, %d from a live read (%.2f%%), %d refused from the store, %d unverified, %d stale pods admitted, %d legitimate pods refused, %d failed; "+
			"decision latency p50 %s p99 %s max %s mean %s; the guard's own part (its histogram's bucket bounds) p50 <= %gs p99 <= %gs mean %s; noisy LISTs %d, p50 %s p90 %s (%d failed); Argo's writes %d",
			what, role, r.decisions, r.live, 100*float64(r.live)/float64(r.decisions), r.storeRefused, r.unverified, r.staleAdmitted, r.legitRefused, r.failed,
			quantile(lat, .5).Round(time.Millisecond), quantile(lat, .99).Round(time.Millisecond), quantile(lat, 1).Round(time.Millisecond), mean(lat).Round(time.Millisecond), guardQ(.5), guardQ(.99),
			time.Duration(testenv.HistogramMeanBetween(before, after, "exit_guard_decision_duration_seconds", map[string]string{"role": role})*float64(time.Second)).Round(time.Millisecond),
			len(r.noisyLists), quantile(r.noisyLists, .5).Round(time.Millisecond), quantile(r.noisyLists, .9).Round(time.Millisecond),
			n.failures.Load(), n.writes.Load())
		if e, ok := n.firstErr.Load().(string); ok {
			t.Logf("the first failed noisy LIST: %s", e)
		}
		if r.legitRefused > 0 {
			t.Errorf("%s: %d exit handlers of a running workflow were refused", what, r.legitRefused)
		}
		if p50 := quantile(r.noisyLists, .5); p50 < budget {
			t.Errorf("%s: the noisy LISTs waited %s at the median, less than the guard's budget of %s: the flood is too weak for this run to prove anything", what, p50, budget)
		}
	}
	if testing.Verbose() {
		t.Logf("guard output:\n%s", strings.Join(out.Lines("live read"), "\n"))
	}
}
