//go:build envtest

package webhook

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// mustDeny creates pod and expects the API server to refuse it on the guard's word, for want.
func mustDeny(t *testing.T, pod *corev1.Pod, want contract.Reason) {
	t.Helper()
	wantRefused(t, env.Client.Create(t.Context(), pod), want)
}

// wantRefused expects err to be the guard's refusal for want, as a client receives it: a 429
// TooManyRequests with no retryAfterSeconds (a transient error for Argo, which client-go does
// not retry inside the call), the code in its causes, and the message the guard wrote, whole,
// in the client's error.
func wantRefused(t *testing.T, err error, want contract.Reason) {
	t.Helper()
	got, ok := contract.RefusalReason(err)
	if !ok || got != want {
		t.Fatalf("err = %v (refusal reason %q), want refused by exit-guard for %s", err, got, want)
	}
	if !apierrors.IsTooManyRequests(err) {
		t.Fatalf("err = %v, want a 429 TooManyRequests, which Argo's controller retries", err)
	}
	if d, ok := apierrors.SuggestsClientDelay(err); ok {
		t.Errorf("the refusal suggests a client delay of %d s: client-go would retry inside the call", d)
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if cause := status.Status().Details.Causes[0]; !strings.Contains(status.Status().Message, cause.Message) {
			t.Errorf("the client's message %q lacks what the guard said of the workflow, %q", status.Status().Message, cause.Message)
		}
	}
}

// wantLogged expects the guard's last refusal of an object of wf to be logged with kv.
func wantLogged(t *testing.T, wf client.Object, kv string) {
	t.Helper()
	lines := guardLog.Lines(`"verdict":"denied"`, `"workflowUID":"`+string(wf.GetUID())+`"`)
	if len(lines) == 0 || !strings.Contains(lines[len(lines)-1], kv) {
		t.Errorf("the refusal of workflow %s is not logged with %s: %v", wf.GetName(), kv, lines)
	}
}

// wantSource expects the guard's last refusal of an object of wf to have been decided from src.
func wantSource(t *testing.T, wf client.Object, src source) {
	t.Helper()
	lines := guardLog.Lines(`"verdict":"denied"`, `"workflowUID":"`+string(wf.GetUID())+`"`)
	if len(lines) == 0 {
		t.Fatalf("no refusal of workflow %s logged", wf.GetName())
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, `"source":"`+string(src)+`"`) {
		t.Errorf("refusal %s was not decided from %s", last, src)
	}
}

func mustAdmit(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := env.Client.Create(t.Context(), pod); err != nil {
		t.Fatalf("creating pod %s: %v, want it admitted", pod.Name, err)
	}
}

func TestStaleExitHandlerOfSucceededWorkflowIsDeniedWithAnEvent(t *testing.T) {
	h := startGuard(t, Options{}, harnessOptions{})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "notify-on-failure-abc", argo.PhaseRunning)
	mustAdmit(t, fixture.Pod(wf, "notify-on-failure-abc", "notify-on-failure-abc"))
	setPhase(t, wf, argo.PhaseSucceeded)

	mustDeny(t, fixture.ExitPod(wf), contract.ReasonWorkflowCompleted)

	ev := waitEvent(t, ns, wf, contract.EventReasonDenied)
	if ev.Type != corev1.EventTypeWarning || ev.Regarding.Kind != argo.Kind || ev.Regarding.Name != wf.GetName() {
		t.Errorf("event = type %s regarding %s/%s, want a Warning on the Workflow", ev.Type, ev.Regarding.Kind, ev.Regarding.Name)
	}
	for _, s := range []string{"exit-handler pod", ".onExit[0].notify", "Succeeded", "live-read"} {
		if !strings.Contains(ev.Note, s) {
			t.Errorf("event note %q does not say %q", ev.Note, s)
		}
	}
	if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "denied", "reason": "workflow-completed"}); got != 1 {
		t.Errorf("denied decisions counted = %v, want 1", got)
	}
	lines := guardLog.Lines(`"msg":"stale workflow pod refused"`, `"workflowUID":"`+string(wf.GetUID())+`"`)
	if len(lines) != 1 {
		t.Fatalf("%d log lines for the denial, want 1", len(lines))
	}
	for _, kv := range []string{`"verdict":"denied"`, `"reason":"workflow-completed"`, `"row":"6"`, `"phase":"Succeeded"`, `"source":"live-read"`, `"podKind":"exit-handler"`} {
		if !strings.Contains(lines[0], kv) {
			t.Errorf("denial log line %s lacks %s", lines[0], kv)
		}
	}
	if got := h.counter(t, "exit_guard_live_read_duration_seconds", map[string]string{"result": "found"}); got < 1 {
		t.Errorf("live reads observed = %v, want at least 1", got)
	}
}

func TestExitHandlersOfRunningAndFailedWorkflowsAreAdmitted(t *testing.T) {
	startGuard(t, Options{}, harnessOptions{})
	ns := newNamespace(t)
	for _, phase := range []argo.Phase{argo.PhaseUnknown, argo.PhasePending, argo.PhaseRunning, argo.PhaseFailed, argo.PhaseError} {
		t.Run("phase "+string(phase), func(t *testing.T) {
			wf := createWorkflow(t, ns, "wf-"+strings.ToLower(string(phase))+"x", phase)
			mustAdmit(t, fixture.ExitPod(wf))
		})
	}
}

func TestFailedAndErrorPhasesCanBeDeniedToo(t *testing.T) {
	startGuard(t, Options{DenyPhases: []argo.Phase{argo.PhaseSucceeded, argo.PhaseFailed, argo.PhaseError}}, harnessOptions{})
	ns := newNamespace(t)
	for _, phase := range []argo.Phase{argo.PhaseFailed, argo.PhaseError} {
		wf := createWorkflow(t, ns, "wf-"+strings.ToLower(string(phase)), phase)
		mustDeny(t, fixture.ExitPod(wf), contract.ReasonWorkflowCompleted)
	}
	mustAdmit(t, fixture.ExitPod(createWorkflow(t, ns, "wf-running", argo.PhaseRunning)))
}

func TestWorkflowRecreatedWithTheSameNameIsNotBlocked(t *testing.T) {
	h := startGuard(t, Options{}, harnessOptions{})
	ns := newNamespace(t)
	old := createWorkflow(t, ns, "reused", argo.PhaseSucceeded)
	waitStore(t, h.store, old, argo.PhaseSucceeded)
	if err := env.Client.Delete(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	wf := createWorkflow(t, ns, "reused", argo.PhaseRunning)
	if wf.GetUID() == old.GetUID() {
		t.Fatal("re-created workflow kept its UID")
	}
	mustAdmit(t, fixture.ExitPod(wf))
	// A late pod of the old workflow names a UID that no longer owns the name.
	mustDeny(t, fixture.ExitPod(old), contract.ReasonWorkflowReplaced)
}

func TestRetriedWorkflowRunsItsExitHandlerAgain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		phase argo.Phase // what the retry writes: Running up to 3.7, "" from v4.0
		opts  Options
		ho    harnessOptions
	}{
		{name: "retry to Running, seen by the watch", phase: argo.PhaseRunning},
		{name: "retry to empty phase (v4), seen by the watch", phase: argo.PhaseUnknown},
		{name: "retry to Running, not yet seen by the guard's watch", phase: argo.PhaseRunning, ho: harnessOptions{noWatch: true}},
		{name: "retry to empty phase, not yet seen, store-first", phase: argo.PhaseUnknown, opts: Options{StoreFirst: true}, ho: harnessOptions{noWatch: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startGuard(t, tc.opts, tc.ho)
			ns := newNamespace(t)
			wf := createWorkflow(t, ns, "retried", argo.PhaseSucceeded)
			if tc.ho.noWatch {
				// The guard saw the completion, then its watch stalled.
				h.store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: ns, Name: wf.GetName(),
					ResourceVersion: wf.GetResourceVersion(), Phase: argo.PhaseSucceeded})
			} else {
				waitStore(t, h.store, wf, argo.PhaseSucceeded)
			}
			mustDeny(t, fixture.ExitPod(wf), contract.ReasonWorkflowCompleted)
			succeededRV := wf.GetResourceVersion()

			// argo retry: same UID, newer resourceVersion, completed label removed.
			labels := wf.GetLabels()
			delete(labels, "workflows.argoproj.io/completed")
			wf.SetLabels(labels)
			setPhase(t, wf, tc.phase)
			mustAdmit(t, fixture.ExitPod(wf))

			if tc.ho.noWatch {
				if r, _ := h.store.Get(wf.GetUID()); r.Phase.Terminal() && r.ResourceVersion == succeededRV && !tc.opts.StoreFirst {
					t.Errorf("store still holds the completion after the live read saw the retry: %+v", r)
				}
			}
		})
	}
}

func TestLateExitHandlerOfDeletedWorkflowIsDenied(t *testing.T) {
	for _, tc := range []struct {
		name string
		ho   harnessOptions
	}{{name: "seen by the watch"}, {name: "guard started cold", ho: harnessOptions{noWatch: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			h := startGuard(t, Options{}, tc.ho)
			ns := newNamespace(t)
			wf := createWorkflow(t, ns, "gone", argo.PhaseRunning)
			if err := env.Client.Delete(t.Context(), wf); err != nil {
				t.Fatal(err)
			}
			if !tc.ho.noWatch {
				waitTombstone(t, h.store, wf)
			}
			mustDeny(t, fixture.ExitPod(wf), contract.ReasonWorkflowDeleted)
			waitEvent(t, ns, wf, contract.EventReasonDenied)
		})
	}
}

func TestColdGuardDecidesRight(t *testing.T) {
	h := startGuard(t, Options{}, harnessOptions{noWatch: true})
	ns := newNamespace(t)
	done := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	running := createWorkflow(t, ns, "running", argo.PhaseRunning)
	if h.store.Len() != 0 {
		t.Fatalf("cold store holds %d records", h.store.Len())
	}
	mustDeny(t, fixture.ExitPod(done), contract.ReasonWorkflowCompleted)
	wantSource(t, done, sourceLive)
	mustAdmit(t, fixture.ExitPod(running))
}

func TestPodsThatAreNotOursAreAdmitted(t *testing.T) {
	// Step and hook pods are not ours with --cover=exit-handlers.
	h := startGuard(t, Options{Cover: Coverage{NoHooks: true, NoSteps: true}}, harnessOptions{})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)

	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain",
		Labels: map[string]string{argo.LabelOnExit: "true"}}, // looks like an exit handler, owned by nobody
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	artgc := fixture.Pod(wf, "done-artgc-wfcomp-1", "")
	artgc.Labels[argo.LabelComponent] = "artifact-gc"
	artgc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "argoproj.io/v1alpha1", Kind: "WorkflowArtifactGCTask",
		Name: "done-artgc-wfcomp-0", UID: "6f1c2a9e-0000-4000-8000-000000000001", Controller: ptr.To(true)}}
	notController := fixture.ExitPod(wf)
	notController.OwnerReferences[0].Controller = nil
	step := fixture.Pod(wf, "done-main-1", "done")
	hook := fixture.Pod(wf, "done-hook-1", "done.hooks.running")

	for _, p := range []*corev1.Pod{plain, artgc, notController, step, hook} {
		t.Run(p.Name, func(t *testing.T) { mustAdmit(t, p) })
	}
	if got := h.counter(t, "exit_guard_live_read_duration_seconds", nil); got != 0 {
		t.Errorf("%v live reads for pods that are not ours, want none", got)
	}
	// The plain, artifact-GC and uncontrolled pods never reach the guard (the pod webhook's
	// object selector and match conditions, as generated); the step and hook pods do, and are
	// admitted by row 4.
	if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"source": sourceRequest}); got != 2 {
		t.Errorf("%v decisions counted as made from the request alone, want the step's and the hook's", got)
	}
	if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"reason": string(contract.ReasonNotCoveredByPolicy)}); got != 2 {
		t.Errorf("%v pods admitted as %s, want the step and the hook", got, contract.ReasonNotCoveredByPolicy)
	}
}

func TestPodsOfUnwatchedNamespacesAreAdmitted(t *testing.T) {
	watched, other := newNamespace(t), newNamespace(t)
	h := startGuard(t, Options{Namespaces: []string{watched}}, harnessOptions{})
	wfOther := createWorkflow(t, other, "done", argo.PhaseSucceeded)
	mustAdmit(t, fixture.ExitPod(wfOther))
	mustDeny(t, fixture.ExitPod(createWorkflow(t, watched, "done", argo.PhaseSucceeded)), contract.ReasonWorkflowCompleted)
	if _, ok := h.store.Get(wfOther.GetUID()); ok {
		t.Error("the store holds a workflow of a namespace it does not watch")
	}
	if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"reason": string(contract.ReasonNamespaceNotWatched)}); got != 1 {
		t.Errorf("namespace-not-watched decisions = %v, want 1", got)
	}
}

func TestCoveragePolicies(t *testing.T) {
	t.Run("every pod by default", func(t *testing.T) {
		h := startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
		// A hook pod is read live, like an exit handler: the first and only pod a stale pass
		// sends, which a lagging store would let through.
		mustDeny(t, fixture.Pod(wf, "done-hook-1", "done.hooks.failed"), contract.ReasonWorkflowCompleted)
		wantLogged(t, wf, `"podKind":"lifecycle-hook"`)
		mustDeny(t, fixture.Pod(wf, "done-step-hook-1", "done[0].work.hooks.failed"), contract.ReasonWorkflowCompleted)
		mustDeny(t, fixture.Pod(wf, "done-under-hook-1", "done.hooks.failed[0].notify"), contract.ReasonWorkflowCompleted)
		waitStore(t, h.store, wf, argo.PhaseSucceeded)
		mustDeny(t, fixture.Pod(wf, "done-main-1", "done"), contract.ReasonWorkflowCompleted)
		wantLogged(t, wf, `"podKind":"step"`)
		running := createWorkflow(t, ns, "running", argo.PhaseRunning)
		mustAdmit(t, fixture.Pod(running, "running-main-1", "running"))
		mustAdmit(t, fixture.Pod(running, "running-hook-1", "running.hooks.failed"))
		// Every refusal here was decided on a live read (the step's confirmed by one, row 18).
		live := map[string]string{"verdict": verdictDenied, "source": string(sourceLive)}
		if got, all := h.counter(t, "exit_guard_decisions_total", live), h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": verdictDenied}); got != 4 || all != 4 {
			t.Errorf("%v refusals counted as decided on a live read, of %v; want all 4", got, all)
		}
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"reason": string(contract.ReasonWorkflowNotTerminal), "source": string(sourceStore)}); got < 1 {
			t.Errorf("%v admissions of the running workflow's step pod counted as decided from the store, want 1", got)
		}
	})
	t.Run("--cover=exit-handlers,hooks", func(t *testing.T) {
		startGuard(t, Options{Cover: Coverage{NoSteps: true}}, harnessOptions{})
		ns := newNamespace(t)
		wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
		mustAdmit(t, fixture.Pod(wf, "done-main-1", "done"))
		mustDeny(t, fixture.Pod(wf, "done-hook-1", "done.hooks.running"), contract.ReasonWorkflowCompleted)
	})
	t.Run("--cover=exit-handlers,steps", func(t *testing.T) {
		h := startGuard(t, Options{Cover: Coverage{NoHooks: true}}, harnessOptions{})
		ns := newNamespace(t)
		wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
		waitStore(t, h.store, wf, argo.PhaseSucceeded)
		mustAdmit(t, fixture.Pod(wf, "done-hook-1", "done.hooks.running"))
		mustDeny(t, fixture.Pod(wf, "done-main-1", "done"), contract.ReasonWorkflowCompleted)
	})
}

// admitStaleExitPod starts a guard in mode and creates the exit-handler pod of a succeeded
// workflow, which the mode admits; pod is the pod as admitted.
func admitStaleExitPod(t *testing.T, mode Mode) (h *harness, ns string, wf *unstructured.Unstructured, pod *corev1.Pod) {
	t.Helper()
	h = startGuard(t, Options{Mode: mode}, harnessOptions{})
	ns = newNamespace(t)
	wf = createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	pod = fixture.ExitPod(wf)
	mustAdmit(t, pod)
	return h, ns, wf, pod
}

func TestWarnModeAdmitsMarksAndAudits(t *testing.T) {
	h, ns, wf, pod := admitStaleExitPod(t, ModeWarn)
	if pod.Labels[contract.LabelSuspect] != "true" || !strings.Contains(pod.Annotations[contract.AnnotationSuspectReason], "Succeeded") {
		t.Errorf("admitted pod labels %v annotations %v, want it marked suspect with the reason", pod.Labels, pod.Annotations)
	}
	waitEvent(t, ns, wf, contract.EventReasonWarned)
	// An operator finds every such pod with one selector.
	var pods corev1.PodList
	if err := env.Client.List(t.Context(), &pods, client.InNamespace(ns), client.HasLabels{contract.LabelSuspect}); err != nil || len(pods.Items) != 1 {
		t.Errorf("listing suspect pods: %d found, err %v; want 1", len(pods.Items), err)
	}
	// A legitimate pod is neither marked nor touched.
	ok := fixture.ExitPod(createWorkflow(t, ns, "running", argo.PhaseRunning))
	mustAdmit(t, ok)
	if _, marked := ok.Labels[contract.LabelSuspect]; marked {
		t.Error("a pod of a running workflow was marked suspect")
	}
	if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "warned"}); got < 1 {
		t.Errorf("warned decisions = %v, want at least 1", got)
	}
}

func TestDryRunModeMarksWithoutAnEvent(t *testing.T) {
	h, ns, wf, pod := admitStaleExitPod(t, ModeDryRun)
	if pod.Labels[contract.LabelSuspect] != "true" {
		t.Errorf("dry-run admitted pod labels %v, want it marked", pod.Labels)
	}
	// Events are sent asynchronously: watch for one for a while; none may come.
	if !eventsStayAtMost(t, ns, wf, 0) {
		t.Error("dry-run mode recorded an Event on the workflow")
	}
	if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "dry-run"}); got < 1 {
		t.Errorf("dry-run decisions = %v, want at least 1", got)
	}
}

func TestDryRunRequestIsDecidedWithoutSideEffects(t *testing.T) {
	h := startGuard(t, Options{}, harnessOptions{})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	err := env.Client.Create(t.Context(), fixture.ExitPod(wf), client.DryRunAll)
	wantRefused(t, err, contract.ReasonWorkflowCompleted)
	// The real one records an Event. Had the dry run recorded one too, the events library
	// would fold the two into one Event with a series of 2, written at once: watch for a
	// while, counting occurrences, not Events.
	mustDeny(t, fixture.ExitPod(wf), contract.ReasonWorkflowCompleted)
	waitEvent(t, ns, wf, contract.EventReasonDenied)
	if !eventsStayAtMost(t, ns, wf, 1) {
		t.Errorf("%d Event occurrences for one real and one dry-run denial, want 1", countEvents(t, ns, wf))
	}
	// The dry run is counted apart, where no alert or panel looks.
	if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "denied"}); got != 1 {
		t.Errorf("denied decisions = %v, want 1 (the real refusal; a dry run is counted apart)", got)
	}
	if got := h.counter(t, "exit_guard_dry_run_decisions_total", map[string]string{"verdict": "denied", "reason": string(contract.ReasonWorkflowCompleted), "kind": "Pod"}); got != 1 {
		t.Errorf("dry-run decisions = %v, want 1", got)
	}
}

// The store forgets a workflow a TTL after its last change, but a completion older than that
// is still a completion: store-first decisions, and step pods (always store-first), recall it from the informer, which holds every workflow that exists, rather
// than admit the stale pod with no live read as "not seen completed".
func TestStoreFirstRecallsACompletionTheStoreHasForgotten(t *testing.T) {
	const ttl = 2 * time.Second
	for _, c := range []struct {
		name string
		opts Options
		pod  func(client.Object) *corev1.Pod
	}{
		{"store-first exit handler", Options{StoreFirst: true}, fixture.ExitPod},
		{"a step pod", Options{}, fixture.StepPod},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := startGuard(t, c.opts, harnessOptions{storeTTL: ttl})
			ns := newNamespace(t)
			wf := createWorkflow(t, ns, "forgotten", argo.PhaseSucceeded)
			waitStore(t, h.store, wf, argo.PhaseSucceeded)
			if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*ttl, false, func(context.Context) (bool, error) {
				_, held := h.store.Get(wf.GetUID())
				return !held, nil
			}); err != nil {
				t.Fatalf("the store never forgot the workflow: %v", err)
			}
			mustDeny(t, c.pod(wf), contract.ReasonWorkflowCompleted)
		})
	}
}

func TestOutOfOrderEventsNeverBringBackAnOlderState(t *testing.T) {
	// The watch delivers states in order; an older copy replayed into the store (as a stale
	// informer would) must not undo a newer one. Checked on real resourceVersions.
	h := startGuard(t, Options{StoreFirst: true}, harnessOptions{noWatch: true})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "wf", argo.PhaseRunning)
	runningRV := wf.GetResourceVersion()
	setPhase(t, wf, argo.PhaseSucceeded)
	succeeded := completionstore.Observation{UID: wf.GetUID(), Namespace: ns, Name: "wf", ResourceVersion: wf.GetResourceVersion(), Phase: argo.PhaseSucceeded}
	running := succeeded
	running.ResourceVersion, running.Phase = runningRV, argo.PhaseRunning
	h.store.Observe(succeeded)
	if r := h.store.Observe(running); r != completionstore.Stale {
		t.Errorf("replayed Running copy: %v, want stale", r)
	}
	mustDeny(t, fixture.ExitPod(wf), contract.ReasonWorkflowCompleted)
}

// The agent pod runs a workflow's HTTP and plugin templates, exit handlers among them: a
// stale copy of a completed workflow creates it to call the exit handler's URL again.
func TestAgentPods(t *testing.T) {
	t.Run("of a succeeded workflow: refused, with an Event", func(t *testing.T) {
		startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		wf := createWorkflow(t, ns, "http-exit", argo.PhaseSucceeded)
		mustDeny(t, fixture.AgentPod(wf), contract.ReasonWorkflowCompleted)
		wantLogged(t, wf, `"podKind":"agent"`)
		ev := waitEvent(t, ns, wf, contract.EventReasonDenied)
		if !strings.Contains(ev.Note, "agent pod") {
			t.Errorf("event note %q does not name the agent pod", ev.Note)
		}
	})
	t.Run("of a running workflow, and an artifact-GC pod of a succeeded one: admitted", func(t *testing.T) {
		h := startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		mustAdmit(t, fixture.AgentPod(createWorkflow(t, ns, "running", argo.PhaseRunning)))
		artgc := fixture.AgentPod(createWorkflow(t, ns, "done", argo.PhaseSucceeded))
		artgc.Name, artgc.Labels[argo.LabelComponent] = "done-artgc-wfcomp-1", "artifact-gc"
		mustAdmit(t, artgc)
		// The pod webhook's not-artifact-gc condition keeps it from the guard (row 2 decides it
		// where a configuration lacks the condition: TestDecisionTable).
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"reason": string(contract.ReasonArtifactGCOrOtherComponent)}); got != 0 {
			t.Errorf("%v artifact-GC pods decided by the guard, want none sent", got)
		}
	})
	t.Run("of a retried workflow the guard's watch has not seen retried: admitted", func(t *testing.T) {
		h := startGuard(t, Options{}, harnessOptions{noWatch: true})
		ns := newNamespace(t)
		wf := createWorkflow(t, ns, "retried", argo.PhaseSucceeded)
		h.store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: ns, Name: wf.GetName(),
			ResourceVersion: wf.GetResourceVersion(), Phase: argo.PhaseSucceeded})
		mustDeny(t, fixture.AgentPod(wf), contract.ReasonWorkflowCompleted)
		retry(t, wf, argo.PhaseUnknown)
		mustAdmit(t, fixture.AgentPod(wf))
	})
	t.Run("of a deleted workflow: refused", func(t *testing.T) {
		startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		wf := createWorkflow(t, ns, "gone", argo.PhaseRunning)
		if err := env.Client.Delete(t.Context(), wf); err != nil {
			t.Fatal(err)
		}
		mustDeny(t, fixture.AgentPod(wf), contract.ReasonWorkflowDeleted)
	})
}
