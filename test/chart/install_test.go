//go:build envtest

package chart

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// install creates the rendered objects for real, except the Deployment and the `helm test` pod
// (no kubelet runs their pods here: the test runs the guard itself) and the webhook
// configurations, which it returns.
func install(t *testing.T, objs []*unstructured.Unstructured) (webhooks []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment", "PodDisruptionBudget", "Pod", "Job":
			continue
		case "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration":
			webhooks = append(webhooks, o)
			continue
		}
		if err := env.Client.Create(t.Context(), o); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		obj := o
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
	return webhooks
}

// createOnce creates obj unless it exists, and deletes it when the test ends.
func createOnce(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(t.Context(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
}

// serveThroughService runs the guard as the chart's Deployment would (the rendered objs' args,
// as their ServiceAccount, with extra flags) on a free port of this machine, its certificate from
// certDir, and has the API server reach it through the rendered Service: an EndpointSlice of
// it, which the API server's aggregator routing dials (no kube-proxy routes a cluster IP here).
// It returns the guard's address; the guard stops with ctx or when the test ends.
func serveThroughService(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured, certDir string, extra ...string) (string, *testenv.Guard, *testenv.Output) {
	t.Helper()
	addr, err := testenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(addr[strings.LastIndex(addr, ":")+1:])
	sa := only(t, objs, "ServiceAccount")
	out := &testenv.Output{}
	g, err := testenv.StartGuard(ctx, guardBin, kubeconfigAs(t, sa.GetNamespace(), sa.GetName()), guardArgs(t, objs,
		append([]string{"--webhook-port=" + strconv.Itoa(port), "--webhook-cert-path=" + certDir}, extra...)...), out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { _ = g.Stop() })
	svc := only(t, objs, "Service")
	ip := testenv.HostAddress(t).String()
	createOnce(t, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: svc.GetNamespace(), Name: svc.GetName() + "-test",
		Labels: map[string]string{discoveryv1.LabelServiceName: svc.GetName()}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("webhook"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}}})
	// kube-apiserver before 1.34 routes a webhook's Service by its Endpoints, not its
	// EndpointSlices (make compat runs 1.30 to 1.37).
	createOnce(t, &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Namespace: svc.GetNamespace(), Name: svc.GetName()}, //nolint:staticcheck // SA1019: what those API servers read
		Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: ip}}, //nolint:staticcheck // SA1019: as above
			Ports: []corev1.EndpointPort{{Name: "webhook", Port: int32(port), Protocol: corev1.ProtocolTCP}}}}}) //nolint:staticcheck // SA1019: as above
	return addr, g, out
}

// liveObject is the object o names, as the API server has it now.
func liveObject(t *testing.T, o *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	l := &unstructured.Unstructured{}
	l.SetGroupVersionKind(o.GroupVersionKind())
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(o), l); err != nil {
		t.Fatal(err)
	}
	return l
}

// pointAt returns a copy of a rendered webhook configuration with only its clientConfig
// changed: the API server calls url, trusting caBundle (none: the field stays empty for the
// guard to fill). The test process cannot be reached through the Service (EndpointSlices
// refuse loopback).
func pointAt(t *testing.T, wh *unstructured.Unstructured, url string, caBundle []byte) *unstructured.Unstructured {
	t.Helper()
	wh = wh.DeepCopy()
	hooks, _, _ := unstructured.NestedSlice(wh.Object, "webhooks")
	for i := range hooks {
		h := hooks[i].(map[string]any)
		cc := h["clientConfig"].(map[string]any)
		path := cc["service"].(map[string]any)["path"].(string)
		newCC := map[string]any{"url": url + path}
		if caBundle != nil {
			newCC["caBundle"] = base64.StdEncoding.EncodeToString(caBundle)
		}
		h["clientConfig"] = newCC
	}
	if err := unstructured.SetNestedSlice(wh.Object, hooks, "webhooks"); err != nil {
		t.Fatal(err)
	}
	return wh
}

// registerAt creates a rendered webhook configuration pointed at url (see pointAt).
func registerAt(t *testing.T, wh *unstructured.Unstructured, url string, caBundle []byte) {
	t.Helper()
	wh = pointAt(t, wh, url, caBundle)
	if err := env.Client.Create(t.Context(), wh); err != nil {
		t.Fatalf("registering %s: %v", wh.GetName(), err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), wh) })
}

// startChartGuard runs the guard as the chart's Deployment would (its arguments, as its
// ServiceAccount), serving the test's webhook address with envtest's certificate (for
// profiles in certificates.mode=chart), and stops it when the test ends.
func startChartGuard(t *testing.T, ns string, objs []*unstructured.Unstructured) (*testenv.Guard, *testenv.Output) {
	t.Helper()
	out := &testenv.Output{}
	g, err := testenv.StartGuard(t.Context(), guardBin, kubeconfigAs(t, ns, only(t, objs, "ServiceAccount").GetName()), guardArgs(t, objs,
		"--webhook-port="+strconv.Itoa(env.WebhookPort), "--webhook-cert-path="+env.WebhookCertDir), out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { _ = g.Stop() })
	return g, out
}

// kubeconfigAs is a kubeconfig that impersonates the ServiceAccount namespace/name: the guard
// then has exactly the permissions the chart grants it.
func kubeconfigAs(t *testing.T, namespace, name string) []byte {
	t.Helper()
	cfg := env.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData,
		Impersonate:       "system:serviceaccount:" + namespace + ":" + name,
		ImpersonateGroups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	kc.Contexts["sa"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "sa"}
	kc.CurrentContext = "sa"
	out, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// guardArgs are the args of the rendered Deployment's container, then the test's overrides.
func guardArgs(t *testing.T, objs []*unstructured.Unstructured, overrides ...string) []string {
	t.Helper()
	dep := convert[appsv1.Deployment](t, only(t, objs, "Deployment"))
	// No drain on Stop: these tests call the guard directly, with no Service to leave. They
	// create the workflows' objects as the API server's administrator, "admin", standing in
	// for Argo's controller.
	args := append(append([]string{}, dep.Spec.Template.Spec.Containers[0].Args...), "--shutdown-delay=0s", "--expected-requester="+testRequester)
	return append(args, overrides...)
}

// testRequester is the user of env.Client (envtest's administrator).
const testRequester = "admin"

func createWorkflow(t *testing.T, ns string, phase argo.Phase) *unstructured.Unstructured {
	t.Helper()
	return testenv.CreateWorkflow(t, env.Client, ns, "notify-on-failure-", phase)
}

func waitDeniedEvent(t *testing.T, wf *unstructured.Unstructured) {
	t.Helper()
	testenv.WaitEvent(t, env.Client, testenv.About(wf, contract.EventReasonDenied))
}

// TestGuardDoesItsJobWithTheChartsPermissions installs the default profile, runs the guard as
// the chart's ServiceAccount (impersonated) with the rendered Deployment's arguments, and has
// the API server call it through the chart's webhook configuration as rendered (clientConfig
// aside). It then checks that permissions the guard does not need are not granted.
func TestGuardDoesItsJobWithTheChartsPermissions(t *testing.T) {
	ns := newNamespace(t, nil)
	objs := render(t, chartCerts, "perm", ns)
	webhooks := install(t, objs)
	sa := only(t, objs, "ServiceAccount").GetName()

	g, out := startChartGuard(t, ns, objs)
	if len(webhooks) != 1 {
		t.Fatalf("the default profile rendered %d webhook configurations, want 1 (pods and TaskSets)", len(webhooks))
	}
	registerAt(t, webhooks[0], fmt.Sprintf("https://%s:%d", env.WebhookHost, env.WebhookPort), env.WebhookCAData)

	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	err := env.Client.Create(t.Context(), fixture.ExitPod(done))
	if !contract.IsRefusal(err) {
		t.Fatalf("stale exit-handler pod: err = %v, want refused by exit-guard\n%s", err, out)
	}
	waitDeniedEvent(t, done)
	checkUnexpectedRequester(t, g, done)
	running := createWorkflow(t, ns, argo.PhaseRunning)
	if err := env.Client.Create(t.Context(), fixture.ExitPod(running)); err != nil {
		t.Errorf("exit-handler pod of a running workflow: %v", err)
	}
	// The match conditions send agent pods too (they run HTTP and plugin exit handlers),
	// and keep artifact-GC pods away.
	agent := fixture.ExitPod(done)
	agent.Name = done.GetName() + "-1340600742-agent"
	delete(agent.Labels, "workflows.argoproj.io/on-exit")
	delete(agent.Annotations, "workflows.argoproj.io/node-name")
	agent.Labels["workflows.argoproj.io/component"] = "agent"
	if reason, _ := contract.RefusalReason(env.Client.Create(t.Context(), agent.DeepCopy(), client.DryRunAll)); reason != contract.ReasonWorkflowCompleted {
		t.Errorf("stale agent pod: refused as %q, want refused by exit-guard as %s", reason, contract.ReasonWorkflowCompleted)
	}
	agent.Labels["workflows.argoproj.io/component"] = "artifact-gc"
	if err := env.Client.Create(t.Context(), agent, client.DryRunAll); err != nil {
		t.Errorf("artifact-GC pod owned by a succeeded workflow: %v", err)
	}
	checkTaskSets(t, ns, true)
	checkEvents(t, ns, true)
	checkPermissions(t, ns, sa, out)
}

// checkUnexpectedRequester creates wf's exit-handler pod as a user other than the expected
// requester: still refused, but counted apart from stale exit handlers, with a Normal Event of
// its own reason.
func checkUnexpectedRequester(t *testing.T, g *testenv.Guard, wf *unstructured.Unstructured) {
	t.Helper()
	other := env.ClientAs(t, "someone-else", "system:masters")
	labels := map[string]string{"kind": "Pod", "reason": "workflow-completed", "verdict": "denied"}
	const denied, apart = "exit_guard_decisions_total", "exit_guard_unexpected_requester_decisions_total"
	counts := func() (float64, float64) {
		mfs, err := g.Metrics(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return testenv.SumSeries(mfs, denied, labels), testenv.SumSeries(mfs, apart, labels)
	}
	before, beforeApart := counts()
	pod := fixture.ExitPod(wf)
	pod.Name += "-again"
	if err := other.Create(t.Context(), pod); !contract.IsRefusal(err) {
		t.Fatalf("the exit-handler pod sent by another user: err = %v, want refused by exit-guard", err)
	}
	if got, gotApart := counts(); got != before || gotApart != beforeApart+1 {
		t.Errorf("%s %v → %v and %s %v → %v: want the refusal counted apart alone", denied, before, got, apart, beforeApart, gotApart)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := env.Client.List(ctx, &list, client.InNamespace(wf.GetNamespace())); err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Regarding.UID == wf.GetUID() && e.Reason == contract.EventReasonUnexpectedRequester {
				return e.Type == corev1.EventTypeNormal && strings.Contains(e.Note, "someone-else"), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no Normal %s Event naming the requester on %s: %v", contract.EventReasonUnexpectedRequester, wf.GetName(), err)
	}
}

// checkTaskSets plays an HTTP exit handler's WorkflowTaskSet writes through the chart's TaskSet
// webhook: a running workflow's writes admitted, cleanup and status writes kept away from the
// guard by the rules and match conditions (counted by the API server), the stale copy's write
// refused (or, with enforce false, admitted).
func checkTaskSets(t *testing.T, ns string, enforce bool) {
	t.Helper()
	calls := env.WebhookCalls(t, "validate-taskset.exit-guard.io")
	wf := createWorkflow(t, ns, argo.PhaseRunning)
	step := argo.NodeID(wf.GetName(), wf.GetName()+"[0].call")
	ts := fixture.TaskSet(wf, map[string]any{step: fixture.HTTPTask("call")})
	// A TaskSet with no tasks, or no spec.tasks at all, starts no work and is not sent.
	before := calls()
	empty := fixture.TaskSet(createWorkflow(t, ns, argo.PhaseRunning), nil)
	empty.Object["spec"] = map[string]any{}
	if err := env.Client.Create(t.Context(), empty); err != nil {
		t.Fatalf("an empty TaskSet: %v", err)
	}
	if got := calls() - before; got != 0 {
		t.Errorf("the API server called the TaskSet webhook %v times for a TaskSet without tasks, want none", got)
	}
	before = calls()
	if err := env.Client.Create(t.Context(), ts); err != nil {
		t.Fatalf("the TaskSet of a running workflow: %v", err)
	}
	if got := calls() - before; got != 1 {
		t.Errorf("the API server called the TaskSet webhook %v times for a TaskSet with a task, want 1", got)
	}
	fixture.MarkPhase(wf, argo.PhaseSucceeded)
	if err := env.Client.Update(t.Context(), wf); err != nil {
		t.Fatal(err)
	}
	before = calls()
	if err := env.Client.Status().Patch(t.Context(), ts, fixture.TaskSetResult(step)); err != nil {
		t.Fatalf("the agent's result: %v", err)
	}
	if err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(true, map[string]any{step: nil})); err != nil {
		t.Fatalf("cleanup of a succeeded workflow's TaskSet: %v", err)
	}
	if got := calls() - before; got != 0 {
		t.Errorf("the API server called the TaskSet webhook %v times for a status write and a cleanup, want none", got)
	}
	key, tmpl := fixture.OnExitTask(wf)
	err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl}))
	switch {
	case enforce && !contract.IsRefusal(err):
		t.Errorf("the stale copy's TaskSet patch: err = %v, want refused by exit-guard", err)
	case !enforce && err != nil:
		t.Errorf("the stale copy's TaskSet patch: %v, want it admitted with a warning", err)
	}
	if got := calls() - before; got != 1 {
		t.Errorf("the API server called the TaskSet webhook %v times for the stale patch, want 1", got)
	}
	// The completed label set back alone, as a stale copy with no new task would.
	if enforce {
		err = env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{}))
		if !contract.IsRefusal(err) {
			t.Errorf("the completed label set back alone: err = %v, want refused by exit-guard", err)
		}
	}
	noMatchConditionErrors(t, "validate-taskset.exit-guard.io")
}

// noMatchConditionErrors: a match condition that fails to evaluate skips the webhook name under
// failurePolicy Ignore (and refuses under Fail), so the API server must have evaluated every
// one of them cleanly.
func noMatchConditionErrors(t *testing.T, name string) {
	t.Helper()
	errs, err := env.APIServerCounter(t.Context(), "apiserver_admission_match_condition_evaluation_errors_total",
		map[string]string{"name": name})
	if err != nil {
		t.Fatal(err)
	}
	if errs != 0 {
		t.Errorf("the API server failed %v times to evaluate the match conditions of %s", errs, name)
	}
}

// checkEvents plays Argo's workflow-phase Events through the chart's Event webhook: every Event
// but a WorkflowFailed about a Workflow kept away from the guard by the match conditions
// (counted by the API server), a real failure's admitted, the stale copy's of a workflow that
// Succeeded refused (or, with enforce false, admitted with a warning).
func checkEvents(t *testing.T, ns string, enforce bool) {
	t.Helper()
	calls := env.WebhookCalls(t, "validate-event.exit-guard.io")
	done := createWorkflow(t, ns, argo.PhaseSucceeded)
	failed := createWorkflow(t, ns, argo.PhaseFailed)
	before := calls()
	aboutAPod := fixture.WorkflowEvent(done, argo.EventReasonWorkflowFailed, "m")
	aboutAPod.InvolvedObject.APIVersion, aboutAPod.InvolvedObject.Kind = "v1", "Pod"
	noReason := fixture.WorkflowEvent(done, "", "m")
	for _, ev := range []*corev1.Event{
		noReason,
		fixture.WorkflowEvent(done, "WorkflowRunning", "Workflow Running"),
		fixture.WorkflowEvent(done, "WorkflowSucceeded", "Workflow completed"),
		fixture.WorkflowEvent(done, "WorkflowTimedOut", "Workflow timed out"),
		aboutAPod,
	} {
		if err := env.Client.Create(t.Context(), ev); err != nil {
			t.Errorf("a %s Event about a %s: %v", ev.Reason, ev.InvolvedObject.Kind, err)
		}
	}
	if got := calls() - before; got != 0 {
		t.Errorf("the API server called the Event webhook %v times for Events that say no workflow failed, want none", got)
	}
	if err := env.Client.Create(t.Context(), fixture.WorkflowEvent(failed, argo.EventReasonWorkflowFailed, "child failed")); err != nil {
		t.Errorf("a real failure's Event: %v, want it admitted", err)
	}
	err := env.Client.Create(t.Context(), fixture.WorkflowEvent(done, argo.EventReasonWorkflowFailed, "child failed"))
	switch reason, _ := contract.RefusalReason(err); {
	case enforce && reason != contract.ReasonWorkflowSucceeded:
		t.Errorf("the stale copy's WorkflowFailed Event: err = %v, want refused by exit-guard as %s", err, contract.ReasonWorkflowSucceeded)
	case !enforce && err != nil:
		t.Errorf("the stale copy's WorkflowFailed Event: %v, want it admitted with a warning", err)
	}
	if got := calls() - before; got != 2 {
		t.Errorf("the API server called the Event webhook %v times for two failure Events, want 2", got)
	}
	noMatchConditionErrors(t, "validate-event.exit-guard.io")
}

// TestWarnModeMarksThroughTheChartsMutatingWebhook does the same in warn mode, where the chart
// registers the mutating webhook: the stale pod is admitted and marked.
func TestWarnModeMarksThroughTheChartsMutatingWebhook(t *testing.T) {
	ns := newNamespace(t, nil)
	objs := render(t, profile{name: "warn", set: []string{"guard.mode=warn", "certificates.mode=chart"}}, "warn", ns)
	webhooks := install(t, objs)
	if len(webhooks) != 2 || webhooks[0].GetKind() != "MutatingWebhookConfiguration" || webhooks[1].GetKind() != "ValidatingWebhookConfiguration" {
		t.Fatalf("warn mode rendered %v, want a MutatingWebhookConfiguration (pods) and a ValidatingWebhookConfiguration (TaskSets)", webhooks)
	}
	startChartGuard(t, ns, objs)
	for _, wh := range webhooks {
		registerAt(t, wh, fmt.Sprintf("https://%s:%d", env.WebhookHost, env.WebhookPort), env.WebhookCAData)
	}

	pod := fixture.ExitPod(createWorkflow(t, ns, argo.PhaseSucceeded))
	if err := env.Client.Create(t.Context(), pod); err != nil {
		t.Fatalf("warn mode refused a pod: %v", err)
	}
	if pod.Labels["exit-guard.io/suspect"] != "true" || pod.Annotations["exit-guard.io/suspect-reason"] == "" {
		t.Errorf("the stale pod was not marked: labels %v annotations %v", pod.Labels, pod.Annotations)
	}
	ok := fixture.ExitPod(createWorkflow(t, ns, argo.PhaseRunning))
	if err := env.Client.Create(t.Context(), ok); err != nil || ok.Labels["exit-guard.io/suspect"] != "" {
		t.Errorf("a running workflow's pod: err %v, labels %v; want admitted unmarked", err, ok.Labels)
	}
	checkTaskSets(t, ns, false)
	checkEvents(t, ns, false)
}

// checkPermissions checks what the ServiceAccount may do: what the guard needs, and nothing of
// what it does not.
func checkPermissions(t *testing.T, ns, sa string, out *testenv.Output) {
	t.Helper()
	if strings.Contains(strings.ToLower(out.String()), "forbidden") {
		t.Errorf("the guard hit a permission it lacks:\n%s", out)
	}

	user := "system:serviceaccount:" + ns + ":" + sa
	expectPermissions(t, user, ns, []permission{
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflows", Verb: "watch"}, true},
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflows", Verb: "get", Namespace: "other"}, true},
		{authorizationv1.ResourceAttributes{Group: "events.k8s.io", Resource: "events", Verb: "create", Namespace: "other"}, true},
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflows", Verb: "update", Namespace: ns}, false},
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflows", Verb: "delete", Namespace: ns}, false},
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflows", Verb: "patch", Namespace: ns}, false},
		{authorizationv1.ResourceAttributes{Resource: "pods", Verb: "create", Namespace: ns}, false},
		{authorizationv1.ResourceAttributes{Resource: "pods", Verb: "list"}, false},
		{authorizationv1.ResourceAttributes{Resource: "secrets", Verb: "get", Namespace: ns}, false},
		{authorizationv1.ResourceAttributes{Resource: "secrets", Verb: "list"}, false},
		{authorizationv1.ResourceAttributes{Resource: "configmaps", Verb: "list"}, false},
		{authorizationv1.ResourceAttributes{Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations", Verb: "update"}, false},
		// The TaskSet comes in the admission request: the guard reads none.
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflowtasksets", Verb: "get", Namespace: ns}, false},
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflowtasksets", Verb: "list"}, false},
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflowtasksets", Verb: "patch", Namespace: ns}, false},
		{authorizationv1.ResourceAttributes{Group: "coordination.k8s.io", Resource: "leases", Verb: "create", Namespace: ns}, false},
	})
}

// permission is a request a ServiceAccount may or may not make.
type permission struct {
	attrs authorizationv1.ResourceAttributes
	want  bool
}

// expectPermissions asks the API server whether user (a ServiceAccount of ns) may make each
// request, and fails each answer that is not the one wanted.
func expectPermissions(t *testing.T, user, ns string, cases []permission) {
	t.Helper()
	for _, tc := range cases {
		name := fmt.Sprintf("%s %s.%s in %q", tc.attrs.Verb, tc.attrs.Resource, tc.attrs.Group, tc.attrs.Namespace)
		if allowed := serviceAccountMay(t, user, ns, tc.attrs); allowed != tc.want {
			t.Errorf("%s: allowed = %v, want %v", name, allowed, tc.want)
		}
	}
}

// TestNamespacedInstallIsScopedToItsNamespaces installs the chart with guard.namespaces, runs
// the guard with exactly the chart's permissions (Roles in the guarded namespaces, no
// cluster-wide rule): it refuses a stale exit-handler pod in its namespace, writes the Event
// there, the API server never calls it for another namespace, and its ServiceAccount may read
// Workflows nowhere else.
func TestNamespacedInstallIsScopedToItsNamespaces(t *testing.T) {
	guarded := newNamespace(t, nil)
	other := newNamespace(t, nil)
	objs := render(t, profile{name: "namespaced", set: []string{"certificates.mode=chart", "guard.namespaces={" + guarded + "}"}}, "scoped", guarded)
	webhooks := install(t, objs)
	sa := only(t, objs, "ServiceAccount").GetName()
	_, out := startChartGuard(t, guarded, objs)
	registerAt(t, webhooks[0], fmt.Sprintf("https://%s:%d", env.WebhookHost, env.WebhookPort), env.WebhookCAData)

	done := createWorkflow(t, guarded, argo.PhaseSucceeded)
	if err := env.Client.Create(t.Context(), fixture.ExitPod(done)); !contract.IsRefusal(err) {
		t.Fatalf("stale exit-handler pod in the guarded namespace: err = %v, want refused by exit-guard\n%s", err, out)
	}
	waitDeniedEvent(t, done)
	elsewhere := createWorkflow(t, other, argo.PhaseSucceeded)
	if err := env.Client.Create(t.Context(), fixture.ExitPod(elsewhere), client.DryRunAll); err != nil {
		t.Errorf("exit-handler pod in a namespace the install does not guard: %v (the webhook's namespaceSelector should keep it from the guard)", err)
	}
	if strings.Contains(strings.ToLower(out.String()), "forbidden") {
		t.Errorf("the guard hit a permission it lacks:\n%s", out)
	}
	expectPermissions(t, "system:serviceaccount:"+guarded+":"+sa, guarded, []permission{
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflows", Verb: "watch", Namespace: guarded}, true},
		{authorizationv1.ResourceAttributes{Group: "events.k8s.io", Resource: "events", Verb: "create", Namespace: guarded}, true},
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflows", Verb: "watch"}, false},
		{authorizationv1.ResourceAttributes{Group: "argoproj.io", Resource: "workflows", Verb: "get", Namespace: other}, false},
		{authorizationv1.ResourceAttributes{Group: "events.k8s.io", Resource: "events", Verb: "create", Namespace: other}, false},
	})
}
