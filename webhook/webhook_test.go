//go:build envtest

package webhook

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
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
	h := startGuard(t, Options{Namespaces: nil}, harnessOptions{})
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

func TestStrictAndHookPolicies(t *testing.T) {
	t.Run("hooks", func(t *testing.T) {
		startGuard(t, Options{Hooks: true}, harnessOptions{})
		ns := newNamespace(t)
		wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
		mustDeny(t, fixture.Pod(wf, "done-hook-1", "done.hooks.running"), contract.ReasonWorkflowCompleted)
		wantLogged(t, wf, `"podKind":"lifecycle-hook"`)
		mustAdmit(t, fixture.Pod(wf, "done-main-1", "done"))
	})
	t.Run("strict", func(t *testing.T) {
		h := startGuard(t, Options{Strict: true}, harnessOptions{})
		ns := newNamespace(t)
		wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
		waitStore(t, h.store, wf, argo.PhaseSucceeded)
		mustDeny(t, fixture.Pod(wf, "done-main-1", "done"), contract.ReasonWorkflowCompleted)
		wantLogged(t, wf, `"podKind":"step"`)
		running := createWorkflow(t, ns, "running", argo.PhaseRunning)
		mustAdmit(t, fixture.Pod(running, "running-main-1", "running"))
	})
}

func TestWarnModeAdmitsMarksAndAudits(t *testing.T) {
	h := startGuard(t, Options{Mode: ModeWarn}, harnessOptions{})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	pod := fixture.ExitPod(wf)
	mustAdmit(t, pod)
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
	h := startGuard(t, Options{Mode: ModeDryRun}, harnessOptions{})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	pod := fixture.ExitPod(wf)
	mustAdmit(t, pod)
	if pod.Labels[contract.LabelSuspect] != "true" {
		t.Errorf("dry-run admitted pod labels %v, want it marked", pod.Labels)
	}
	// Events are sent asynchronously: watch for one for a while; none may come.
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 3*time.Second, true,
		func(context.Context) (bool, error) { return countEvents(t, ns, wf) > 0, nil })
	if err == nil {
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
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 3*time.Second, true,
		func(context.Context) (bool, error) { return countEvents(t, ns, wf) > 1, nil })
	if err == nil {
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
// is still a completion: store-first decisions, and step pods under --strict (always
// store-first), recall it from the informer, which holds every workflow that exists, rather
// than admit the stale pod with no live read as "not seen completed".
func TestStoreFirstRecallsACompletionTheStoreHasForgotten(t *testing.T) {
	const ttl = 2 * time.Second
	for _, c := range []struct {
		name string
		opts Options
		pod  func(client.Object) *corev1.Pod
	}{
		{"store-first exit handler", Options{StoreFirst: true}, fixture.ExitPod},
		{"strict: a step pod", Options{Strict: true}, fixture.StepPod},
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

// waitStore polls until the store's record of wf has the phase.
func waitStore(t *testing.T, s *completionstore.Store, wf *unstructured.Unstructured, phase argo.Phase) {
	t.Helper()
	waitRecord(t, s, wf, "reach "+string(phase), func(r completionstore.Record) bool { return r.Phase == phase })
}

// waitTombstone polls until the store holds a tombstone of wf.
func waitTombstone(t *testing.T, s *completionstore.Store, wf *unstructured.Unstructured) {
	t.Helper()
	waitRecord(t, s, wf, "deleted", func(r completionstore.Record) bool { return r.Deleted })
}

func waitRecord(t *testing.T, s *completionstore.Store, wf *unstructured.Unstructured, what string, cond func(completionstore.Record) bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) {
			r, ok := s.Get(wf.GetUID())
			return ok && cond(r), nil
		}); err != nil {
		t.Fatalf("the store never saw %s %s", wf.GetName(), what)
	}
}

// countEvents counts the occurrences of Events about wf: the events library folds Events with
// the same regarding object, reason, action and reporter into one with a series count.
func countEvents(t *testing.T, namespace string, wf client.Object) int {
	t.Helper()
	var list = &unstructured.UnstructuredList{}
	list.SetAPIVersion("events.k8s.io/v1")
	list.SetKind("EventList")
	if err := env.Client.List(t.Context(), list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if uid, _, _ := unstructured.NestedString(e.Object, "regarding", "uid"); uid == string(wf.GetUID()) {
			n++
			if count, ok, _ := unstructured.NestedInt64(e.Object, "series", "count"); ok && count > 1 {
				n += int(count) - 1
			}
		}
	}
	return n
}

// flaky is a read fault that fails the first failures reads, then lets them through: hang makes
// the first one hang until its context ends, and the rest of the failures answer 503 at once.
// failures < 0 fails every read. calls counts the reads.
func flaky(failures int32, hang bool) (fault func(context.Context) error, calls *atomic.Int32) {
	calls = &atomic.Int32{}
	return func(ctx context.Context) error {
		n := calls.Add(1)
		if failures >= 0 && n > failures {
			return nil
		}
		if hang && n == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return apierrors.NewServiceUnavailable("the API server is overloaded")
	}, calls
}

// retry writes what argo retry does: same UID, the completed label removed, the phase reset.
func retry(t *testing.T, wf *unstructured.Unstructured, phase argo.Phase) {
	t.Helper()
	labels := wf.GetLabels()
	delete(labels, "workflows.argoproj.io/completed")
	wf.SetLabels(labels)
	setPhase(t, wf, phase)
}

// A workflow Succeeded and the guard saw it; it was retried, the guard's watch has not
// delivered the retry, and the API server answers the live read only on the third attempt
// (the first hangs past its attempt timeout, the second fails at once). The whole budget is
// used, and the retried workflow's exit handler runs, with the default store fallback (fresh,
// the watch having just advanced) that would refuse it had no read answered, and with
// completion. No GET beside a slow LIST here: the attempts are the hedge and the retry.
func TestRetriedWorkflowIsAdmittedWhileLiveReadsFailAtFirst(t *testing.T) {
	for _, fallback := range []StoreFallback{"", FallbackCompletion} {
		t.Run("fallback "+cmp.Or(string(fallback), "default"), func(t *testing.T) {
			retriedWorkflowAdmittedOnALateAnswer(t, fallback)
		})
	}
}

func retriedWorkflowAdmittedOnALateAnswer(t *testing.T, fallback StoreFallback) {
	fault, calls := flaky(2, true)
	h := startGuard(t, Options{LiveReadTimeout: 300 * time.Millisecond, LiveReadBudget: 3 * time.Second, GetBesideListAfter: -1, StoreFallback: fallback},
		harnessOptions{noWatch: true, reader: faultyReader(t, fault, fault)})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "retried", argo.PhaseSucceeded)
	h.store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: ns, Name: wf.GetName(),
		ResourceVersion: wf.GetResourceVersion(), Phase: argo.PhaseSucceeded})
	h.store.Progress(wf.GetResourceVersion())
	h.store.NoteLag(0)
	retry(t, wf, argo.PhaseRunning)

	mustAdmit(t, fixture.ExitPod(wf))
	if got := calls.Load(); got != 3 {
		t.Errorf("%d live read attempts, want 3", got)
	}
	for cause, want := range map[string]float64{"hedged": 1, "error": 1} {
		if got := h.counter(t, "exit_guard_live_read_retries_total", map[string]string{"cause": cause}); got != want {
			t.Errorf("live read retries with cause %s = %v, want %v", cause, got, want)
		}
	}
}

// When no live read answers within the budget, the store alone decides, as --store-fallback
// says. Here the workflow was retried and the guard's watch never delivered the retry: the
// worst case of a store fallback. With tombstone a completion only the store holds never
// refuses; with requeue (the default) and completion it always refuses the exit handler (a
// 429: Argo's controller sends it again on its next pass, when the guard can read the
// workflow); with fresh it refuses while the watch advanced within --store-fresh-for, and
// admits once the watch has been quiet longer. A tombstone refuses in every case.
func TestStoreFallbackWhenNoLiveReadAnswers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fallback StoreFallback
		// quiet is how long ago the watch last advanced; 0 means it never did.
		quiet  time.Duration
		denied bool
	}{
		{name: "tombstone: a completion only the store holds admits", fallback: FallbackTombstone, quiet: time.Second, denied: false},
		{name: "default, the watch advanced a second ago: it refuses", quiet: time.Second, denied: true},
		{name: "default, the watch quiet for two minutes: it refuses", quiet: 2 * time.Minute, denied: true},
		{name: "default, the watch never advanced: it refuses", denied: true},
		{name: "fresh, the watch advanced a second ago: it refuses", fallback: FallbackFresh, quiet: time.Second, denied: true},
		{name: "fresh, the watch quiet for two minutes: it admits", fallback: FallbackFresh, quiet: 2 * time.Minute, denied: false},
		{name: "fresh, the watch never advanced: it admits", fallback: FallbackFresh, denied: false},
		{name: "completion, the watch quiet for two minutes: it refuses", fallback: FallbackCompletion, quiet: 2 * time.Minute, denied: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fault, calls := flaky(-1, false)
			clk := clocktesting.NewFakeClock(time.Now())
			h := startGuard(t, Options{StoreFallback: tc.fallback, LiveReadTimeout: 100 * time.Millisecond, LiveReadBudget: 500 * time.Millisecond},
				harnessOptions{noWatch: true, reader: faultyReader(t, fault, fault), storeClock: clk})
			ns := newNamespace(t)
			wf := createWorkflow(t, ns, "retried", argo.PhaseSucceeded)
			h.store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: ns, Name: wf.GetName(),
				ResourceVersion: wf.GetResourceVersion(), Phase: argo.PhaseSucceeded})
			if tc.quiet > 0 {
				h.store.Progress(wf.GetResourceVersion())
				h.store.NoteLag(0)
				clk.Step(tc.quiet)
			}
			retry(t, wf, argo.PhaseUnknown)
			if tc.denied {
				mustDeny(t, fixture.ExitPod(wf), contract.ReasonWorkflowCompleted)
				wantSource(t, wf, sourceStore)
			} else {
				mustAdmit(t, fixture.ExitPod(wf))
				if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"reason": string(contract.ReasonUnconfirmedCompletion)}); got != 1 {
					t.Errorf("unconfirmed-completion decisions = %v, want 1", got)
				}
				if lines := guardLog.Lines(`only the store says its workflow completed`, `"workflowUID":"`+string(wf.GetUID())+`"`); len(lines) != 1 {
					t.Errorf("%d log lines for the unconfirmed completion, want 1", len(lines))
				}
			}
			if calls.Load() < 2 {
				t.Errorf("%d live read attempts in a 500 ms budget, want retries", calls.Load())
			}
			gone := createWorkflow(t, ns, "gone", argo.PhaseSucceeded)
			h.store.Observe(completionstore.Observation{UID: gone.GetUID(), Namespace: ns, Name: gone.GetName(),
				ResourceVersion: gone.GetResourceVersion(), Phase: argo.PhaseSucceeded, Deleted: true})
			mustDeny(t, fixture.ExitPod(gone), contract.ReasonWorkflowDeleted)
			wantSource(t, gone, sourceStore)
		})
	}
}

// The guard is stopped while decisions are in flight: each is still decided on its live read
// and answered, never turned into a store fallback by the shutdown.
func TestShutdownFinishesTheDecisionsInFlight(t *testing.T) {
	var inFlight atomic.Int32
	slow := func(ctx context.Context) error {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
			return nil
		}
	}
	h := startGuard(t, Options{}, harnessOptions{noWatch: true, reader: faultyReader(t, slow, nil)})
	ns := newNamespace(t)
	wf := createWorkflow(t, ns, "done", argo.PhaseSucceeded)
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() { errs <- env.Client.Create(context.Background(), fixture.ExitPod(wf), client.DryRunAll) }()
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true,
			func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("never: %s", what)
		}
	}
	waitFor("every decision in flight", func() bool { return inFlight.Load() == n })
	h.stop()
	for range n {
		if reason, _ := contract.RefusalReason(<-errs); reason != contract.ReasonWorkflowCompleted {
			t.Errorf("a decision in flight at shutdown answered %q, want refused on its live read", reason)
		}
	}
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
		startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		mustAdmit(t, fixture.AgentPod(createWorkflow(t, ns, "running", argo.PhaseRunning)))
		artgc := fixture.AgentPod(createWorkflow(t, ns, "done", argo.PhaseSucceeded))
		artgc.Name, artgc.Labels[argo.LabelComponent] = "done-artgc-wfcomp-1", "artifact-gc"
		mustAdmit(t, artgc)
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
