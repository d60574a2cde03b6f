//go:build envtest

package faults

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// metric reads one sample of the guard's metrics endpoint: name with its labels as written,
// e.g. `exit_guard_store_records{state="deleted"}`; -1 when absent or not served yet.
func (r *replica) metric(t *testing.T, sample string) float64 {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+r.g.MetricsAddr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// The metrics server starts on its own and may not listen yet: callers poll.
		return -1
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", sample, err)
			}
			return f
		}
	}
	return -1
}

// threeWorkflows creates, in a new namespace, a running workflow, a Succeeded one, and one
// that was deleted.
func threeWorkflows(t *testing.T) (running, succeeded, deleted *unstructured.Unstructured) {
	t.Helper()
	ns := newNamespace(t)
	running = createWorkflow(t, ns, "running", argo.PhaseRunning)
	succeeded = createWorkflow(t, ns, "succeeded", argo.PhaseSucceeded)
	deleted = createWorkflow(t, ns, "deleted", argo.PhaseRunning)
	if err := env.Client.Delete(t.Context(), deleted); err != nil {
		t.Fatal(err)
	}
	return running, succeeded, deleted
}

// decideAll creates an exit-handler pod of each workflow (dry runs) and checks each answer:
// refused when want says so, admitted otherwise; it counts into c.
func decideAll(t *testing.T, c *tally, want map[*unstructured.Unstructured]bool) {
	t.Helper()
	for wf, deny := range want {
		c.sent.Add(1)
		err := env.Client.Create(t.Context(), fixture.ExitPod(wf), client.DryRunAll)
		switch {
		case err == nil:
			c.admitted.Add(1)
			if deny {
				c.wrong.Add(1)
				t.Errorf("the exit handler of %s was admitted, want it refused", wf.GetName())
			}
		case contract.IsRefusal(err):
			c.denied.Add(1)
			if !deny {
				c.wrong.Add(1)
				t.Errorf("the exit handler of %s was refused: %v", wf.GetName(), err)
			}
		default:
			c.fail(err.Error())
			t.Errorf("the exit handler of %s: %v", wf.GetName(), err)
		}
	}
}

// While the API server's watch cache (re)initializes it answers a LIST by name 429 with a
// Retry-After; the live read (client-go's own retries off) retries at once with a GET of the
// whole object (from etcd), and every exit handler is still decided live, inside the deadline.
func TestListsRefusedWhileTheWatchCacheInitializesAreDecidedByAGet(t *testing.T) {
	b := newService(t)
	p := testenv.StartAPIProxy(t, env.Config)
	r := startReplicaWith(t, b, "a", p.KubeConfig(t), "--live-read-timeout=300ms", "--live-read-budget=2s")

	running, succeeded, deleted := threeWorkflows(t)
	p.ThrottleLists.Store(true)
	c := &tally{}
	for range 3 {
		decideAll(t, c, map[*unstructured.Unstructured]bool{running: false, succeeded: true, deleted: true})
	}
	t.Logf("lists refused 429: %s; %d lists refused", c, p.Throttled.Load())
	if p.Throttled.Load() == 0 {
		t.Error("no live read was refused 429: the test proved nothing")
	}
	// Absent (-1) until the first failure.
	if got := max(0, r.metric(t, `exit_guard_live_read_failures_total{kind="timeout"}`)) + max(0, r.metric(t, `exit_guard_live_read_failures_total{kind="error"}`)); got != 0 {
		t.Errorf("%v live reads fell back to the store, want every one answered by a GET", got)
	}
	if got := r.metric(t, `exit_guard_live_read_retries_total{cause="error"}`); got < float64(c.sent.Load()) {
		t.Errorf("%v retries after an error for %d decisions, want one each (the GET after the refused LIST)", got, c.sent.Load())
	}
}

// TestLiveReadsThatHangAreDecidedInsideTheDeadline: the guard's store saw a workflow succeed
// and another deleted through a watch that was delivering; then the API server stops
// answering (every live read hangs, the watch stream holds every event and bookmark back).
// The guard answers inside the webhook's timeout, from its store. With the default
// (--store-fallback=requeue) the stale exit handler of the completed workflow is refused
// throughout: Argo's controller sends a refused pod again on its next pass, so a retry the
// watch never delivered would wait, not lose its notice. With --store-fallback=fresh it is
// refused while the newest write the store received is younger than --store-fresh-for (5 s)
// and admitted once older, counted as unconfirmed-completion. The deleted workflow's is
// refused throughout, the running one's admitted.
func TestLiveReadsThatHangAreDecidedInsideTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		fallback string
		// lateRefused: the stale exit handler is still refused once the store's newest write
		// is older than --store-fresh-for.
		lateRefused bool
	}{{"", true}, {"fresh", false}} {
		name := "default"
		args := []string{"--live-read-timeout=300ms", "--live-read-budget=1s"}
		if tc.fallback != "" {
			name = "--store-fallback=" + tc.fallback
			args = append(args, name)
		}
		t.Run(name, func(t *testing.T) {
			b := newService(t)
			p := testenv.StartAPIProxy(t, env.Config)
			r := startReplicaWith(t, b, "a", p.KubeConfig(t), args...)

			running, succeeded, deleted := threeWorkflows(t)
			waitFor(t, "the guard's store to hold the deletion and the completion", func() bool {
				return r.metric(t, `exit_guard_store_records{state="deleted"}`) >= 1 && r.metric(t, `exit_guard_store_records{state="terminal"}`) >= 1
			})
			// A last write the guard's watch delivers (as a busy cluster's watch always has
			// one coming), then the API server hangs.
			rv := r.metric(t, "exit_guard_watch_resource_version")
			touched := running.DeepCopy()
			touched.SetAnnotations(map[string]string{"touched": "yes"})
			if err := env.Client.Update(t.Context(), touched); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the guard's watch to deliver the last write", func() bool { return r.metric(t, "exit_guard_watch_resource_version") > rv })
			p.Stall.Store(true)
			p.HangReads.Store(true)
			quiet := time.Now()

			c := &tally{}
			decideAll(t, c, map[*unstructured.Unstructured]bool{succeeded: true})
			took := time.Since(quiet)
			t.Logf("live reads hanging, watch stalled: %s in %s; %d reads held until the guard gave up", c, took.Round(time.Millisecond), p.Hung.Load())
			if p.Hung.Load() == 0 {
				t.Error("no live read reached the hanging proxy: the test proved nothing")
			}
			if took > 4*time.Second {
				t.Fatalf("the decision inside the fresh window took %s: this machine is too slow for the test to mean anything", took)
			}
			completed := `exit_guard_dry_run_decisions_total{kind="Pod",reason="workflow-completed",verdict="denied"}`
			if got := r.metric(t, completed); got != 1 {
				t.Errorf("%v refusals of the completed workflow's exit handler (workflow-completed), want 1: the store's fresh completion refuses", got)
			}

			waitFor(t, "the store's newest write to be older than --store-fresh-for", func() bool { return time.Since(quiet) > 6*time.Second })
			late := &tally{}
			decideAll(t, late, map[*unstructured.Unstructured]bool{running: false, succeeded: tc.lateRefused, deleted: true})
			t.Logf("the newest write older than 5 s: %s", late)
			unconfirmed := `exit_guard_dry_run_decisions_total{kind="Pod",reason="unconfirmed-completion",verdict="allowed"}`
			want := map[bool]float64{true: 0, false: 1}[tc.lateRefused]
			// The dry-run counter's series appear with their first decision: absent is none.
			if got := max(0, r.metric(t, unconfirmed)); got != want {
				t.Errorf("%v admissions as unconfirmed-completion once the store's newest write was older than --store-fresh-for, want %v", got, want)
			}
			if got, want := r.metric(t, completed), map[bool]float64{true: 2, false: 1}[tc.lateRefused]; got != want {
				t.Errorf("%v refusals as workflow-completed in all, want %v", got, want)
			}
			if sent := c.sent.Load() + late.sent.Load(); r.metric(t, `exit_guard_live_read_failures_total{kind="timeout"}`) < float64(sent) {
				t.Errorf("%v live reads counted as timed out, want %d", r.metric(t, `exit_guard_live_read_failures_total{kind="timeout"}`), sent)
			}
		})
	}
}

// TestWatchExpiresWhileWorkflowsCompleteAndAreDeleted: the guard's watch stalls while
// workflows complete and are deleted; etcd compacts past it; the stream is cut, the guard
// watches again from its old resourceVersion, gets 410 Gone and lists anew. Its store must then
// hold every completion and every deletion (the deletions it missed come as
// DeletedFinalStateUnknown), and admissions flow through it all.
func TestWatchExpiresWhileWorkflowsCompleteAndAreDeleted(t *testing.T) {
	b := newService(t)
	p := testenv.StartAPIProxy(t, env.Config)
	ns := newNamespace(t)
	const n = 5
	var toComplete, toDelete []*unstructured.Unstructured
	for i := range n {
		toComplete = append(toComplete, createWorkflow(t, ns, "complete-"+strconv.Itoa(i), argo.PhaseRunning))
		toDelete = append(toDelete, createWorkflow(t, ns, "delete-"+strconv.Itoa(i), argo.PhaseRunning))
	}
	r := startReplicaWith(t, b, "a", p.KubeConfig(t), "--live-read-timeout=300ms", "--live-read-budget=1s", "--store-fallback=completion")
	waitFor(t, "the guard's store to hold the running workflows", func() bool {
		return r.metric(t, `exit_guard_store_records{state="active"}`) >= 2*n
	})
	running := createWorkflow(t, ns, "running", argo.PhaseRunning)
	succeeded := createWorkflow(t, ns, "succeeded", argo.PhaseSucceeded)
	loadCtx, stopLoad := context.WithCancel(t.Context())
	c, wait := load(loadCtx, running, succeeded, 2, 20)

	p.Stall.Store(true)
	p.CutWatches() // the guard watches again, into the stall
	for i := range n {
		wf := toComplete[i]
		fixture.MarkPhase(wf, argo.PhaseSucceeded)
		if err := env.Client.Update(t.Context(), wf); err != nil {
			t.Fatal(err)
		}
		// Each workflow to delete fails first, and the guard reads it live at that newer
		// resourceVersion (an exit handler of a Failed workflow is admitted by default);
		// the relist then reports its deletion with the older copy the informer had.
		gone := toDelete[i]
		fixture.MarkPhase(gone, argo.PhaseFailed)
		if err := env.Client.Update(t.Context(), gone); err != nil {
			t.Fatal(err)
		}
		decideAll(t, &tally{}, map[*unstructured.Unstructured]bool{gone: false})
		if err := env.Client.Delete(t.Context(), gone); err != nil {
			t.Fatal(err)
		}
	}
	// Compaction runs every second (the API server's flags, see TestMain): wait until the
	// guard's resourceVersion is gone from etcd.
	rv := strconv.FormatFloat(r.metric(t, "exit_guard_watch_resource_version"), 'f', 0, 64)
	waitFor(t, "etcd to compact past the guard's watch", func() bool { return compacted(t, ns, rv) })
	relists := r.metric(t, `exit_guard_store_observations_total{result="applied"}`)
	lists := p.Lists.Load()
	p.Stall.Store(false)
	p.CutWatches()
	p.HangReads.Store(true) // from here the store alone decides
	waitFor(t, "the guard's store to hold every completion and deletion", func() bool {
		return r.metric(t, `exit_guard_store_records{state="deleted"}`) >= n && r.metric(t, `exit_guard_store_records{state="terminal"}`) >= n+1
	})
	want := map[*unstructured.Unstructured]bool{running: false}
	for i := range n {
		want[toComplete[i]], want[toDelete[i]] = true, true
	}
	decideAll(t, &tally{}, want)
	stopLoad()
	wait()
	t.Logf("watch expired (410) and relisted under load: %s; store observations applied after the cut: %v",
		c, r.metric(t, `exit_guard_store_observations_total{result="applied"}`)-relists)
	if c.failed.Load() != 0 || c.wrong.Load() != 0 {
		t.Errorf("admissions lost or decided wrong: %s; first failures %q", c, c.failures)
	}
	if p.Lists.Load() == lists {
		t.Error("the guard never listed Workflows again after its watch expired: no 410, no relist; the test proved nothing")
	}
}

// compacted says whether a Workflow watch from rv is refused with 410 Gone.
func compacted(t *testing.T, ns, rv string) bool {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(argo.GroupVersion.WithKind("WorkflowList"))
	w, err := c.Watch(t.Context(), list, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
	if err != nil {
		return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
	}
	defer w.Stop()
	select {
	case e := <-w.ResultChan():
		return e.Type == "ERROR"
	case <-time.After(500 * time.Millisecond):
		return false
	}
}

// TestReplicaKilledUnderLoad kills one of two replicas (SIGKILL: a crash, an OOM kill) while
// admissions flow, and starts its replacement. The admissions in flight on the killed replica,
// and those the Service still sends it until its endpoints catch up, get no answer, and the API
// server applies the failure policy to them. With Fail, each is a failed pod creation (counted
// here); with Ignore, the chart's default, no pod creation fails: they are admitted undecided,
// the fail-open window that the API server counts in apiserver_admission_webhook_fail_open_count.
// None may be decided wrong.
func TestReplicaKilledUnderLoad(t *testing.T) {
	for _, policy := range []admissionregistrationv1.FailurePolicyType{admissionregistrationv1.Fail, admissionregistrationv1.Ignore} {
		t.Run("failurePolicy "+string(policy), func(t *testing.T) {
			b := newService(t)
			a := startReplica(t, b, "a")
			startReplica(t, b, "b")
			ns := newNamespace(t)
			if policy == admissionregistrationv1.Ignore {
				ns = failOpenNamespace(t)
			}
			running := createWorkflow(t, ns, "running", argo.PhaseRunning)
			succeeded := createWorkflow(t, ns, "succeeded", argo.PhaseSucceeded)
			waitFor(t, "the webhook of the namespace to be called", func() bool {
				err := env.Client.Create(t.Context(), fixture.ExitPod(succeeded), client.DryRunAll)
				return contract.IsRefusal(err)
			})
			loadCtx, stopLoad := context.WithCancel(t.Context())
			c, wait := load(loadCtx, running, succeeded, 8, 80)
			c.sentAtLeast(t, 80)
			if err := a.g.Kill(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the killed replica out of rotation", func() bool { return !b.inRotation("a") })
			startReplica(t, b, "a2")
			c.sentAtLeast(t, 80)
			stopLoad()
			wait()
			t.Logf("one of two replicas killed under load, failurePolicy %s: %s; connections refused at the Service: %d; failures: %q",
				policy, c, b.refused.Load(), c.failures)
			for _, f := range c.allFailures() {
				if !strings.Contains(f, "failed calling webhook") {
					t.Errorf("an admission failed for another reason than the killed replica: %s", f)
				}
			}
			switch policy {
			case admissionregistrationv1.Fail:
				if c.wrong.Load() != 0 {
					t.Errorf("admissions decided wrong: %s", c)
				}
			default:
				// Undecided admissions show as stale pods admitted; the running workflow's
				// are all admitted, decided or not.
				if c.failed.Load() != 0 {
					t.Errorf("pod creations failed although the webhook fails open: %s", c)
				}
				if c.denied.Load() == 0 {
					t.Errorf("nothing refused: the guard was not called: %s", c)
				}
			}
		})
	}
}

// failOpenNamespace makes a namespace that the package's webhook (failurePolicy Fail) does
// not see, and registers the guard's webhook for it alone with failurePolicy Ignore.
func failOpenNamespace(t *testing.T) string {
	t.Helper()
	labels := map[string]string{"exit-guard-faults-open": "true"}
	ns := testenv.Namespace(t, env.Client, "faults-open-", labels)
	vwc, err := testenv.GuardWebhook()
	if err != nil {
		t.Fatal(err)
	}
	vwc.Name = ns
	ignore := admissionregistrationv1.Ignore
	url := "https://" + hostPort() + "/validate-pod"
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].FailurePolicy = &ignore
		vwc.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{MatchLabels: labels}
		vwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: env.WebhookCAData}
	}
	if err := env.Client.Create(t.Context(), vwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), vwc) })
	return ns
}

// TestAPIServerRestartsUnderLoad stops kube-apiserver while admissions flow, starts it again,
// and checks that the guard comes back by itself: every admission the restarted API server
// sends it is decided right, and its watch resumes (a workflow completed after the restart
// reaches its store).
func TestAPIServerRestartsUnderLoad(t *testing.T) {
	b := newService(t)
	r := startReplica(t, b, "a")
	r2 := startReplica(t, b, "b")
	ns := newNamespace(t)
	running := createWorkflow(t, ns, "running", argo.PhaseRunning)
	succeeded := createWorkflow(t, ns, "succeeded", argo.PhaseSucceeded)
	loadCtx, stopLoad := context.WithCancel(t.Context())
	c, wait := load(loadCtx, running, succeeded, 4, 40)
	c.sentAtLeast(t, 40)
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	down := c.sent.Load()
	if err := env.StartAPIServer(); err != nil {
		t.Fatalf("restarting the API server: %v", err)
	}
	up := c.sent.Load()
	later := createWorkflow(t, ns, "completed-after-restart", argo.PhaseRunning)
	fixture.MarkPhase(later, argo.PhaseSucceeded)
	if err := env.Client.Update(t.Context(), later); err != nil {
		t.Fatal(err)
	}
	rv, _ := strconv.ParseFloat(later.GetResourceVersion(), 64)
	waitFor(t, "the guard's watch to resume past the restart", func() bool {
		return r.metric(t, "exit_guard_watch_resource_version") >= rv
	})
	c.sentAtLeast(t, 80)
	stopLoad()
	wait()
	var apiDown, webhook int
	for _, f := range c.allFailures() {
		if strings.Contains(f, "failed calling webhook") {
			webhook++
		} else {
			apiDown++
		}
	}
	// A stale pod admitted with no live answer, while the store's newest write is older than
	// --store-fresh-for, is the default's documented window (unconfirmed-completion): counted,
	// and alerted by ExitGuardDecisionsUnverified. Seen once in a loaded CI run, when the
	// restarted API server answered no read within the budget. Any other wrong decision fails.
	var window float64
	for _, rep := range []*replica{r, r2} {
		window += max(0, rep.metric(t, `exit_guard_dry_run_decisions_total{kind="Pod",reason="unconfirmed-completion",verdict="allowed"}`)) +
			max(0, rep.metric(t, `exit_guard_dry_run_decisions_total{kind="Pod",reason="unverified-fail-open",verdict="allowed"}`))
	}
	t.Logf("API server restarted under load: %s; of the failures, %d never reached an API server (%d requests were sent while it was stopping or starting) and %d were the webhook's; admitted unverified (the documented window): %v",
		c, apiDown, up-down, webhook, window)
	if c.wrongRefused.Load() != 0 || float64(c.wrong.Load()) > window || webhook != 0 {
		t.Errorf("admissions the API server sent the guard were lost (%d) or decided wrong beyond the %v counted unverified: %s", webhook, window, c)
	}
}
