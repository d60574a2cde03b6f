//go:build envtest

package webhook

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientretry "k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// patchStaleInMode starts a guard in mode and has the stale copy of a completed workflow named
// name patch its TaskSet with the exit handler's task: the mode admits it, with exit-guard's
// warning.
func patchStaleInMode(t *testing.T, mode Mode, name string) (h *harness, ns string, wf *unstructured.Unstructured) {
	t.Helper()
	h = startGuard(t, Options{Mode: mode}, harnessOptions{})
	ns = newNamespace(t)
	wf, ts, step := runningTaskSet(t, ns, name)
	complete(t, wf, ts, step)
	w := &warnings{}
	key, tmpl := fixture.OnExitTask(wf)
	if err := warningClient(t, w).Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl})); err != nil {
		t.Fatalf("%s mode refused the stale patch: %v", mode, err)
	}
	if !strings.Contains(w.all(), "exit-guard ("+string(mode)+" mode) would refuse this write") {
		t.Errorf("warnings %q, want exit-guard's", w.all())
	}
	return h, ns, wf
}

// The stale copy's write, as on an exposed controller: the exit handler's task added and the
// completed label set back to "false".
func TestTaskSetWrites(t *testing.T) {
	t.Run("a stale patch of a succeeded workflow: refused, with an Event, a log line, the metric", func(t *testing.T) {
		h := startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		wf, ts, step := runningTaskSet(t, ns, "http-exit")
		complete(t, wf, ts, step)

		key, tmpl := fixture.OnExitTask(wf)
		err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl}))
		wantRefused(t, err, contract.ReasonWorkflowCompleted)
		wantSource(t, wf, sourceLive)
		// Nothing of the stale write landed: the agent has nothing to run.
		var got unstructured.Unstructured
		got.SetGroupVersionKind(fixture.TaskSetGVK)
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(ts), &got); err != nil {
			t.Fatal(err)
		}
		if tasks, _, _ := unstructured.NestedMap(got.Object, "spec", "tasks"); len(tasks) != 0 || got.GetLabels()[argo.LabelCompleted] != "true" {
			t.Errorf("TaskSet after the refusal: tasks %v, labels %v; want no task and completed=true", tasks, got.GetLabels())
		}

		ev := waitEvent(t, ns, wf, contract.EventReasonDenied)
		for _, s := range []string{"WorkflowTaskSet http-exit", "the exit handler http-exit.onExit", "Succeeded"} {
			if !strings.Contains(ev.Note, s) {
				t.Errorf("event note %q does not say %q", ev.Note, s)
			}
		}
		if ev.Action != "UpdateWorkflowTaskSet" {
			t.Errorf("event action %q, want UpdateWorkflowTaskSet", ev.Action)
		}
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "denied", "kind": argo.TaskSetKind}); got != 1 {
			t.Errorf("denied TaskSet decisions counted = %v, want 1", got)
		}
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "denied", "kind": "Pod"}); got != 0 {
			t.Errorf("denied pod decisions counted = %v, want 0", got)
		}
		lines := guardLog.Lines(`"msg":"stale workflow WorkflowTaskSet write refused"`, `"workflowUID":"`+string(wf.GetUID())+`"`)
		if len(lines) != 1 {
			t.Fatalf("%d log lines for the refusal, want 1", len(lines))
		}
		for _, kv := range []string{`"verdict":"denied"`, `"reason":"workflow-completed"`, `"tasksAdded":["` + key + `"]`, `"completedReopened":true`} {
			if !strings.Contains(lines[0], kv) {
				t.Errorf("log line %s lacks %s", lines[0], kv)
			}
		}
	})

	t.Run("the label set back alone, with no task: refused", func(t *testing.T) {
		startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		wf, ts, step := runningTaskSet(t, ns, "reopen")
		complete(t, wf, ts, step)
		if err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{})); !contract.IsRefusal(err) {
			t.Fatalf("setting completed back to false: err = %v, want refused", err)
		}
	})

	t.Run("status writes never reach the webhook", func(t *testing.T) {
		startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		wf, ts, step := runningTaskSet(t, ns, "results")
		complete(t, wf, ts, step)
		// What the API server counts of its calls to the TaskSet webhook.
		calls := env.WebhookCalls(t, "validate-taskset.exit-guard.io")
		before := calls()
		// The agent's and the controller's writes of results after completion.
		agentReports(t, ts, "results-1")
		agentReports(t, ts, "results-2")
		if got := calls(); got != before {
			t.Errorf("the API server called the TaskSet webhook %v times for two status writes, want none", got-before)
		}
		// A write of the main resource that adds a task is counted: the count above can see a
		// call (the workflow has completed: the guard refuses it).
		added := fixture.TaskSetPatch(false, map[string]any{"results-3": fixture.HTTPTask("again")})
		if err := env.Client.Patch(t.Context(), ts, added); !contract.IsRefusal(err) {
			t.Errorf("adding a task to a completed workflow's TaskSet: %v, want refused", err)
		}
		if got := calls(); got != before+1 {
			t.Errorf("the API server called the TaskSet webhook %v times for one write of the main resource, want 1", got-before)
		}
	})

	t.Run("a running workflow's HTTP steps: every write admitted", func(t *testing.T) {
		h := startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		wf, ts, step := runningTaskSet(t, ns, "steps")
		second := argo.NodeID("steps", "steps[1].call")
		if err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{second: fixture.HTTPTask("second"), step: nil})); err != nil {
			t.Fatalf("adding a step to a running workflow's TaskSet: %v", err)
		}
		agentReports(t, ts, second)
		key, tmpl := fixture.OnExitTask(wf)
		if err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl, second: nil})); err != nil {
			t.Fatalf("adding the exit handler while the workflow runs: %v", err)
		}
		agentReports(t, ts, key)
		complete(t, wf, ts, key)
		// At least the create and the two patches: the API server runs admission again when it
		// retries a patch on a conflict (here with the agent's status writes), so under load a
		// write may be judged twice. None may be refused.
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "allowed", "reason": string(contract.ReasonWorkflowNotTerminal), "kind": argo.TaskSetKind}); got < 3 {
			t.Errorf("TaskSet writes admitted as %s = %v, want at least 3 (create and two patches)", contract.ReasonWorkflowNotTerminal, got)
		}
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "denied", "kind": argo.TaskSetKind}); got != 0 {
			t.Errorf("%v TaskSet writes of a running workflow refused, want none", got)
		}
		// The cleanup adds no task: the webhook's match conditions keep it from the guard.
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "allowed", "reason": string(contract.ReasonNoNewTask), "kind": argo.TaskSetKind}); got != 0 {
			t.Errorf("TaskSet writes admitted as %s = %v, want 0 (the cleanup is not sent)", contract.ReasonNoNewTask, got)
		}
	})

	t.Run("Argo's create on its next passes: admitted without a read, fails AlreadyExists; after completion, with the guard's store behind, the patch after it is judged and refused, and the next create read", func(t *testing.T) {
		// No watch: the store knows the workflow only from the live read of its first create,
		// and never sees it complete (the worst case for row T7).
		h := startGuard(t, Options{}, harnessOptions{noWatch: true})
		ns := newNamespace(t)
		wf, ts, step := runningTaskSet(t, ns, "passes")
		reads := func() float64 { return h.counter(t, "exit_guard_live_read_duration_seconds", nil) }
		repeated := func() float64 {
			return h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "allowed", "reason": string(contract.ReasonRepeatsAdmittedCreate), "kind": argo.TaskSetKind})
		}
		before := reads()
		for pass := range 3 {
			err := env.Client.Create(t.Context(), fixture.TaskSet(wf, map[string]any{step: fixture.HTTPTask("call")}))
			if !apierrors.IsAlreadyExists(err) {
				t.Fatalf("pass %d: the running workflow's create again: err = %v, want AlreadyExists (admitted, then found existing)", pass+1, err)
			}
		}
		if got := repeated(); got != 3 {
			t.Errorf("creates admitted as %s = %v, want 3", contract.ReasonRepeatsAdmittedCreate, got)
		}
		if got := reads() - before; got != 0 {
			t.Errorf("the repeated creates made %v live reads, want none", got)
		}
		complete(t, wf, ts, step)
		// A stale copy's pass with the step still pending: its create repeats the admitted one
		// and fails AlreadyExists; its patch adds the task back and sets the label back.
		err := env.Client.Create(t.Context(), fixture.TaskSet(wf, map[string]any{step: fixture.HTTPTask("call")}))
		if !apierrors.IsAlreadyExists(err) || repeated() != 4 {
			t.Fatalf("a repeated create after completion, the store behind: err = %v (want AlreadyExists), %v admitted as %s (want 4)", err, repeated(), contract.ReasonRepeatsAdmittedCreate)
		}
		err = env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{step: fixture.HTTPTask("call")}))
		wantRefused(t, err, contract.ReasonWorkflowCompleted)
		// The refusal forgot the create: the same create is now read, and refused.
		reads0 := reads()
		err = env.Client.Create(t.Context(), fixture.TaskSet(wf, map[string]any{step: fixture.HTTPTask("call")}))
		wantRefused(t, err, contract.ReasonWorkflowCompleted)
		if got := reads() - reads0; got < 1 {
			t.Errorf("the create after a refusal made %v live reads, want one", got)
		}
		// A stale copy's create with its exit handler's task beside the step's: read, refused.
		key, tmpl := fixture.OnExitTask(wf)
		err = env.Client.Create(t.Context(), fixture.TaskSet(wf, map[string]any{step: fixture.HTTPTask("call"), key: tmpl}))
		wantRefused(t, err, contract.ReasonWorkflowCompleted)
	})

	for _, storeFirst := range []bool{false, true} {
		// Live read first, or store first (the store's completion confirmed live).
		t.Run(fmt.Sprintf("a retried workflow the guard's watch has not seen retried: admitted (store-first %v)", storeFirst), func(t *testing.T) {
			h := startGuard(t, Options{StoreFirst: storeFirst}, harnessOptions{noWatch: true})
			ns := newNamespace(t)
			wf, ts, step := runningTaskSet(t, ns, "retried")
			complete(t, wf, ts, step)
			h.store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: ns, Name: wf.GetName(),
				ResourceVersion: wf.GetResourceVersion(), Phase: argo.PhaseSucceeded})
			key, tmpl := fixture.OnExitTask(wf)
			if err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl})); !contract.IsRefusal(err) {
				t.Fatalf("before the retry: err = %v, want refused", err)
			}
			retry(t, wf, argo.PhaseUnknown)
			if err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl})); err != nil {
				t.Fatalf("the retried workflow's TaskSet patch: %v, want it admitted", err)
			}
			if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"reason": string(contract.ReasonWorkflowNotTerminal), "kind": argo.TaskSetKind}); got < 1 {
				t.Errorf("TaskSet writes admitted as %s = %v, want the retried one", contract.ReasonWorkflowNotTerminal, got)
			}
		})
	}

	t.Run("a TaskSet created for a deleted workflow: refused", func(t *testing.T) {
		startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		wf := createWorkflow(t, ns, "gone", argo.PhaseRunning)
		if err := env.Client.Delete(t.Context(), wf); err != nil {
			t.Fatal(err)
		}
		key, tmpl := fixture.OnExitTask(wf)
		err := env.Client.Create(t.Context(), fixture.TaskSet(wf, map[string]any{key: tmpl}))
		wantRefused(t, err, contract.ReasonWorkflowDeleted)
	})

	t.Run("name reused while the old TaskSet waits for the garbage collector: a patch alone refused as taskset-owner-gone, admitted once the status holds the node, or after the new workflow's create of the same template", func(t *testing.T) {
		h := startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		// No garbage collector runs here: the old TaskSet stays, owned by the deleted UID.
		old, ts, wf := reuseName(t, ns, "reused")
		key := argo.NodeID(wf.GetName(), wf.GetName()+"[0].call")
		tmpl := fixture.HTTPTask(key)
		// Argo creates first (the create names the new workflow: admitted, then AlreadyExists),
		// then patches the old object, which keeps the old owner reference. Here the create
		// went to another replica of the guard (the patch is sent alone): this one cannot know
		// who sent the patch, and the new workflow's status lacks the task's node (Argo writes
		// it after the TaskSet, in the same pass).
		err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl}))
		wantRefused(t, err, contract.ReasonTaskSetOwnerGone)
		for _, s := range []string{"still belongs to workflow " + ns + "/reused (uid " + string(old.GetUID()) + "), which was deleted",
			"a later write is admitted once the guard can tell it is this workflow's", "garbage collector"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("the refusal %q does not say %q", err, s)
			}
		}
		ev := waitEvent(t, ns, old, contract.EventReasonTaskSetOwnerGone)
		if ev.Type != "Normal" {
			t.Errorf("the Event about it is %s, want Normal (not a stale exit handler)", ev.Type)
		}
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "denied", "reason": string(contract.ReasonTaskSetOwnerGone), "kind": argo.TaskSetKind}); got != 1 {
			t.Errorf("taskset-owner-gone refusals counted = %v, want 1", got)
		}
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "denied", "reason": string(contract.ReasonWorkflowReplaced), "kind": argo.TaskSetKind}); got != 0 {
			t.Errorf("workflow-replaced refusals counted = %v, want 0: the write is not a stale exit handler", got)
		}
		// Argo writes the task's node into the workflow's status after the TaskSet, in the
		// same pass; the next pass patches again, and is admitted (row T6).
		err = clientretry.RetryOnConflict(clientretry.DefaultRetry, func() error {
			cur := &unstructured.Unstructured{}
			cur.SetGroupVersionKind(argo.WorkflowGVK)
			if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(wf), cur); err != nil {
				return err
			}
			node := map[string]any{"id": key, "name": "reused[0].call", "type": argo.NodeTypeHTTP, "phase": "Pending"}
			if err := unstructured.SetNestedField(cur.Object, map[string]any{key: node}, "status", "nodes"); err != nil {
				return err
			}
			return env.Client.Update(t.Context(), cur)
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl})); err != nil {
			t.Fatalf("the new workflow's patch once its status holds the node: %v, want admitted (row T6)", err)
		}
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "allowed", "reason": string(contract.ReasonTasksOfNameHolder), "kind": argo.TaskSetKind}); got != 1 {
			t.Errorf("tasks-of-name-holder admissions counted = %v, want 1", got)
		}
		// Its exit handler's task: never admitted from the status alone (a stale copy's exit
		// handler has the same node ID), but from the create this replica judged just before,
		// with the same template; with another template (a stale copy's own) it stays refused.
		key2, tmpl2 := fixture.OnExitTask(wf)
		// With a null, as Argo writes pointer fields without omitempty: the create keeps it,
		// the merge patch's new key loses it (RFC 7386).
		tmpl2["http"].(map[string]any)["timeoutSeconds"] = nil
		err = env.Client.Create(t.Context(), fixture.TaskSet(wf, map[string]any{key: tmpl, key2: tmpl2}))
		if !apierrors.IsAlreadyExists(err) {
			t.Fatalf("the new workflow's create: %v, want AlreadyExists (admitted by the guard)", err)
		}
		other := fixture.HTTPTask("stale " + key2)
		err = env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl, key2: other}))
		wantRefused(t, err, contract.ReasonTaskSetOwnerGone)
		if err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl, key2: tmpl2})); err != nil {
			t.Fatalf("the new workflow's patch after its create: %v, want admitted (row T6)", err)
		}
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "allowed", "reason": string(contract.ReasonTasksOfNameHolder), "kind": argo.TaskSetKind}); got != 2 {
			t.Errorf("tasks-of-name-holder admissions counted = %v, want 2", got)
		}
	})

	t.Run("name reused over a TaskSet that still holds the new workflow's task: its patch, which only sets completed back, admitted after its create", func(t *testing.T) {
		h := startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		old := createWorkflow(t, ns, "leftover", argo.PhaseRunning)
		key := argo.NodeID(old.GetName(), old.GetName()+"[0].call")
		tmpl := fixture.HTTPTask("call")
		ts := fixture.TaskSet(old, map[string]any{key: tmpl})
		if err := env.Client.Create(t.Context(), ts); err != nil {
			t.Fatal(err)
		}
		// The workflow completes and its cleanup leaves the unfulfilled task behind (Argo's
		// removeCompletedTaskSetStatus removes fulfilled tasks only); then it is deleted and
		// the garbage collector has not run.
		setPhase(t, old, argo.PhaseSucceeded)
		labelOnly := client.RawPatch(types.MergePatchType, fixture.JSON(map[string]any{"metadata": map[string]any{"labels": map[string]any{argo.LabelCompleted: "true"}}}))
		if err := env.Client.Patch(t.Context(), ts, labelOnly); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(t.Context(), old); err != nil {
			t.Fatal(err)
		}
		wf := createWorkflow(t, ns, "leftover", argo.PhaseRunning)
		// Argo's create (AlreadyExists), then its patch of every pending task, which the
		// object holds already: the patch adds no key and only sets completed back.
		if err := env.Client.Create(t.Context(), fixture.TaskSet(wf, map[string]any{key: tmpl})); !apierrors.IsAlreadyExists(err) {
			t.Fatalf("the new workflow's create: %v, want AlreadyExists (admitted by the guard)", err)
		}
		if err := env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl})); err != nil {
			t.Fatalf("the new workflow's patch after its create: %v, want admitted (row T6)", err)
		}
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "allowed", "reason": string(contract.ReasonTasksOfNameHolder), "kind": argo.TaskSetKind}); got != 1 {
			t.Errorf("tasks-of-name-holder admissions counted = %v, want 1", got)
		}
	})

	t.Run("row T7 after the name was reused, the guard's watch behind: admitted, then counted and told once the guard sees the new workflow", func(t *testing.T) {
		// The longest repeat window, so that the steps below fit in it on a busy machine.
		h := startGuard(t, Options{TaskSetRepeatsFor: createMemory}, harnessOptions{noWatch: true})
		ns := newNamespace(t)
		old := createWorkflow(t, ns, "again", argo.PhaseRunning)
		h.store.Observe(completionstore.Observation{UID: old.GetUID(), Namespace: ns, Name: old.GetName(),
			ResourceVersion: old.GetResourceVersion(), Phase: argo.PhaseRunning})
		key := argo.NodeID(old.GetName(), old.GetName()+"[0].call")
		tmpl := fixture.HTTPTask("call")
		ts := fixture.TaskSet(old, map[string]any{key: tmpl})
		if err := env.Client.Create(t.Context(), ts); err != nil {
			t.Fatalf("the running workflow's create: %v, want admitted (row 5)", err)
		}
		// The workflow is deleted, the garbage collector deletes its TaskSet, and a new
		// workflow takes the name; the guard's watch has seen none of it.
		for _, o := range []client.Object{ts, old} {
			if err := env.Client.Delete(t.Context(), o); err != nil {
				t.Fatal(err)
			}
		}
		wf := createWorkflow(t, ns, "again", argo.PhaseRunning)
		var seen argo.Workflow
		if err := h.client.Get(t.Context(), client.ObjectKeyFromObject(wf), &seen); err != nil {
			t.Fatal(err)
		}
		// A stale copy of the deleted workflow sends the create the guard admitted for it, more
		// than the clock margin after the new workflow's last write (to the second), within the
		// repeat window.
		late := completionstore.ObservationOf(&seen, false).WrittenAt.Add(repeatsClockSkew + 1500*time.Millisecond)
		if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return time.Now().After(late), nil
		}); err != nil {
			t.Fatalf("the clock did not pass %v: %v", late, err)
		}
		if err := env.Client.Create(t.Context(), fixture.TaskSet(old, map[string]any{key: tmpl})); err != nil {
			t.Fatalf("the stale copy's repeated create: %v, want admitted (row T7: the case it leaves)", err)
		}
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "allowed", "reason": string(contract.ReasonRepeatsAdmittedCreate), "kind": argo.TaskSetKind}); got != 1 {
			t.Fatalf("repeats-admitted-create admissions = %v, want 1", got)
		}
		// The watch delivers the new workflow.
		h.store.Observe(completionstore.ObservationOf(&seen, false))
		if got := h.counter(t, "exit_guard_repeats_after_reuse_total", nil); got != 1 {
			t.Errorf("exit_guard_repeats_after_reuse_total = %v, want 1", got)
		}
		ev := waitEvent(t, ns, wf, contract.EventReasonRepeatAfterReuse)
		if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Note, string(old.GetUID())) {
			t.Errorf("the Event: %s %q, want a Warning naming the deleted workflow's uid", ev.Type, ev.Note)
		}
		// Told once.
		h.store.Observe(completionstore.ObservationOf(&seen, false))
		if got := h.counter(t, "exit_guard_repeats_after_reuse_total", nil); got != 1 {
			t.Errorf("after the same workflow seen again: %v, want 1", got)
		}
	})

	t.Run("a create another user sends vouches for nothing Argo sends: its patch of a deleted workflow's TaskSet stays refused", func(t *testing.T) {
		h := startGuard(t, Options{}, harnessOptions{})
		ns := newNamespace(t)
		// The name is reused; the old TaskSet waits for the garbage collector.
		_, ts, wf := reuseName(t, ns, "planted")
		key, tmpl := fixture.OnExitTask(wf)
		// Another tenant of the namespace, who may create TaskSets, sends a create that names
		// the running workflow with the exit handler's task: the guard admits it (the
		// workflow runs), then the API server finds the object exists.
		mallory := userClient(t, ns, "mallory", "workflowtasksets")
		err := mallory.Create(t.Context(), fixture.TaskSet(wf, map[string]any{key: tmpl}))
		if !apierrors.IsAlreadyExists(err) {
			t.Fatalf("the other user's create: %v, want AlreadyExists (admitted by the guard)", err)
		}
		// The stale copy of the deleted, succeeded workflow then patches its own TaskSet with
		// its exit handler's task, the same template, as Argo's controller.
		err = env.Client.Patch(t.Context(), ts, fixture.TaskSetPatch(false, map[string]any{key: tmpl}))
		wantRefused(t, err, contract.ReasonTaskSetOwnerGone)
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "allowed", "reason": string(contract.ReasonTasksOfNameHolder), "kind": argo.TaskSetKind}); got != 0 {
			t.Errorf("tasks-of-name-holder admissions counted = %v, want 0", got)
		}
	})

	t.Run("warn mode: admitted with a warning and an Event", func(t *testing.T) {
		h, ns, wf := patchStaleInMode(t, ModeWarn, "warned")
		waitEvent(t, ns, wf, contract.EventReasonWarned)
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "warned", "kind": argo.TaskSetKind}); got != 1 {
			t.Errorf("warned TaskSet decisions = %v, want 1", got)
		}
	})

	t.Run("dry-run mode: admitted with a warning, no Event", func(t *testing.T) {
		h, ns, wf := patchStaleInMode(t, ModeDryRun, "dry")
		if got := h.counter(t, "exit_guard_decisions_total", map[string]string{"verdict": "dry-run", "kind": argo.TaskSetKind}); got != 1 {
			t.Errorf("dry-run TaskSet decisions = %v, want 1", got)
		}
		if !eventsStayAtMost(t, ns, wf, 0) {
			t.Error("dry-run mode recorded an Event on the workflow")
		}
	})
}
