// Command demo replays the reference scenario against a local API server and the real
// exit-guard binary: a workflow whose exit handler notifies only on failure succeeds; a stale
// copy of it then tries to create the notification pod and the API server refuses it; a
// workflow that really failed gets its notification. It ends by itself; `make demo` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

func main() {
	guardBin := flag.String("guard", "bin/exit-guard", "The exit-guard binary to run.")
	verbose := flag.Bool("v", false, "Show the guard's own log.")
	flag.Parse()
	if err := run(*guardBin, *verbose); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo FAILED: %v\n", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func run(guardBin string, verbose bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	say("== Starting a local kube-apiserver and etcd (built from Go modules by hack/envtest-binaries.sh)")
	// The webhook as generated from the code's markers: failing open, only for Argo's pods.
	vwc, err := testenv.GuardWebhook()
	if err != nil {
		return err
	}
	env, err := testenv.Start(testenv.Options{ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{vwc}})
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()

	stopGuard, metricsAddr, err := startGuard(ctx, env, guardBin, verbose)
	if err != nil {
		return err
	}
	defer stopGuard()

	c := env.Client
	ns := "demo"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}

	before, err := scrape(ctx, metricsAddr)
	if err != nil {
		return err
	}

	say("\n== 1. A workflow succeeds")
	wf, err := newWorkflow(ctx, c, ns)
	if err != nil {
		return err
	}
	say("Workflow %s: main step, then an exit handler that notifies only when {{workflow.status}} != Succeeded.", wf.GetName())
	if err := writePhase(ctx, c, wf, argo.PhaseRunning); err != nil {
		return err
	}
	if err := c.Create(ctx, fixture.Pod(wf, wf.GetName(), wf.GetName())); err != nil {
		return fmt.Errorf("the main step's pod was refused: %w", err)
	}
	say("The controller created the main step's pod: admitted.")
	say("The main step succeeded; the exit handler's `when` was false, so no notification pod was made.")
	runningRV := wf.GetResourceVersion()
	if err := writePhase(ctx, c, wf, argo.PhaseSucceeded); err != nil {
		return err
	}
	say("Workflow %s is Succeeded (resourceVersion %s); podGC deletes its pods.", wf.GetName(), wf.GetResourceVersion())

	say("\n== 2. A stale copy of it comes back")
	say("Under API-server load an older copy (phase Running, resourceVersion %s) returns to the controller's cache.", runningRV)
	say("The controller finds the main pod gone, marks the workflow Error and runs the exit handler:")
	notify := fixture.ExitPod(wf)
	say("it creates pod %s for node %s ...", notify.Name, notify.Annotations[argo.AnnotationNodeName])
	err = c.Create(ctx, notify)
	if !contract.IsRefusal(err) {
		return fmt.Errorf("the stale notification pod was not refused: the guard did not act (create returned: %w)", err)
	}
	say("The API server refused it:\n  %s", err)
	ev, err := waitEvent(ctx, c, ns, wf)
	if err != nil {
		return err
	}
	say("Event on workflow %s:\n  %s  %s  %s", wf.GetName(), ev.Type, ev.Reason, ev.Note)
	say("No failure notice is sent for a workflow that succeeded.")

	say("\n== 3. A workflow that really fails still gets its notification")
	failed, err := newWorkflow(ctx, c, ns)
	if err != nil {
		return err
	}
	if err := writePhase(ctx, c, failed, argo.PhaseRunning); err != nil {
		return err
	}
	say("Workflow %s: its main step failed; while the workflow is still Running the exit handler runs.", failed.GetName())
	fp := fixture.ExitPod(failed)
	if err := c.Create(ctx, fp); err != nil {
		return fmt.Errorf("the real failure notification was refused: %w", err)
	}
	say("Pod %s for node %s: admitted.", fp.Name, fp.Annotations[argo.AnnotationNodeName])
	if err := writePhase(ctx, c, failed, argo.PhaseFailed); err != nil {
		return err
	}
	say("Workflow %s is Failed, and its failure notice went out.", failed.GetName())

	after, err := scrape(ctx, metricsAddr)
	if err != nil {
		return err
	}
	say("\n== What moved in the guard's metrics (http://%s/metrics; the series that did not move are left out)", metricsAddr)
	for _, l := range moved(before, after) {
		say("  %s", l)
	}
	say("\ndemo done: one stale exit handler refused, one real one admitted.")
	return nil
}

// startGuard runs the exit-guard binary against env, on the address its webhook is registered
// at, and waits until it reports ready.
func startGuard(ctx context.Context, env *testenv.Env, bin string, verbose bool) (stop func(), metricsAddr string, err error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, "", fmt.Errorf("no guard binary at %s: run 'make build' (make demo does): %w", bin, err)
	}
	say("== Starting %s (enforce mode; webhook on port %d)", bin, env.WebhookPort)
	out := io.Discard
	if verbose {
		out = os.Stdout
	}
	g, err := testenv.StartGuard(ctx, bin, env.KubeConfig(), []string{
		"--webhook-port", strconv.Itoa(env.WebhookPort),
		"--webhook-cert-path", env.WebhookCertDir,
		"--zap-encoder", "console",
		"--shutdown-delay", "0s", // no Service in front of it to drain
	}, out)
	if err != nil {
		return nil, "", fmt.Errorf("%w (rerun with -v to see its log)", err)
	}
	say("exit-guard is ready: its Workflow cache has synced and its webhook serves TLS.")
	return func() {
		if err := g.Stop(); err != nil && verbose {
			say("exit-guard stopped: %v", err)
		}
	}, g.MetricsAddr, nil
}

// newWorkflow creates the reference workflow: a step, and an exit handler that notifies when
// the workflow did not succeed.
func newWorkflow(ctx context.Context, c client.Client, ns string) (*unstructured.Unstructured, error) {
	wf := fixture.Workflow(ns, "notify-on-failure-")
	spec := wf.Object["spec"].(map[string]any)
	spec["podGC"] = map[string]any{"strategy": "OnPodCompletion"}
	spec["templates"] = []any{
		map[string]any{"name": "main", "container": map[string]any{"image": "busybox", "command": []any{"sh", "-c", "echo working"}}},
		map[string]any{"name": "notify-failure", "container": map[string]any{"image": "busybox", "command": []any{"sh", "-c", "echo workflow failed"}}},
		map[string]any{"name": "exit-handler", "steps": []any{[]any{map[string]any{
			"name": "notify", "template": "notify-failure", "when": "{{workflow.status}} != Succeeded"}}}},
	}
	return wf, c.Create(ctx, wf)
}

// writePhase writes the workflow's phase the way Argo's controller does: one Update of the
// whole object, with the phase and completed labels.
func writePhase(ctx context.Context, c client.Client, wf *unstructured.Unstructured, phase argo.Phase) error {
	fixture.MarkPhase(wf, phase)
	return c.Update(ctx, wf)
}

func waitEvent(ctx context.Context, c client.Client, ns string, wf *unstructured.Unstructured) (eventsv1.Event, error) {
	var found eventsv1.Event
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Regarding.UID == wf.GetUID() && e.Reason == contract.EventReasonDenied {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return found, errors.New("the guard recorded no Event on the workflow")
	}
	return found, nil
}

// scrape reads the guard's own series (exit_guard_*, histogram buckets left out): each line's
// name and labels, and its value.
func scrape(ctx context.Context, addr string) (map[string]string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, "exit_guard_") || strings.Contains(l, "_bucket{") {
			continue
		}
		if i := strings.LastIndexByte(l, ' '); i > 0 {
			out[l[:i]] = l[i+1:]
		}
	}
	return out, nil
}

// moved lists the series whose value changed from before to after (new ones too), sorted.
func moved(before, after map[string]string) []string {
	var out []string
	for series, v := range after {
		if was, ok := before[series]; !ok || was != v {
			if !ok {
				was = "none"
			}
			out = append(out, fmt.Sprintf("%s %s (was %s)", series, v, was))
		}
	}
	slices.Sort(out)
	return out
}
