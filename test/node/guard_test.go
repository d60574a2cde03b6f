//go:build node

package node_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

const (
	release   = "eg"
	releaseNS = "exit-guard"
	deploy    = "eg-exit-guard"
)

// kubeconfig writes the test API server's admin kubeconfig into a file of the test.
func kubeconfig(t *testing.T) string {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	return kc
}

// helm runs the pinned helm on the node's API server; it returns its output and error.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := testenv.HelmBin()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append(args, "--kubeconfig", kubeconfig(t))...) //nolint:gosec // G204: the pinned helm
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	return out.String(), err
}

// mustHelm is helm that fails the test on an error.
func mustHelm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, cluster.Logs("kubelet"))
	}
	return out
}

// guardLogs returns the last lines of each guard pod's log (kubectl logs, through the API
// server and kubelet), for a failure's message.
func guardLogs(t *testing.T) string {
	t.Helper()
	kubectl, err := testenv.KubectlBin()
	if err != nil {
		return err.Error()
	}
	kc := kubeconfig(t)
	var b strings.Builder
	for _, p := range guardPods(t) {
		out, _ := exec.Command(kubectl, "--kubeconfig", kc, "-n", releaseNS, "logs", p.Name, "--tail", "20").CombinedOutput() //nolint:gosec // G204: the built kubectl
		fmt.Fprintf(&b, "\n--- %s, its last log lines:\n%s", p.Name, out)
	}
	return b.String()
}

// nodeValues are the values that put the chart on this node: the image loaded into containerd,
// never pulled (no registry).
func nodeValues() []string {
	return []string{
		"--set", "image.registry=exit-guard.local", "--set", "image.repository=exit-guard", "--set", "image.tag=node",
		"--set", "image.pullPolicy=Never",
	}
}

var installed struct {
	once sync.Once
	took time.Duration
	err  string
}

// installChart installs the chart once for the package's tests, as a user would: helm install
// --wait, its defaults (two replicas, enforce, every pod a workflow owns) but nodeValues.
func installChart(t *testing.T) {
	t.Helper()
	installed.once.Do(func() {
		start := time.Now()
		out, err := helm(t, append([]string{"install", release, filepath.Join(testenv.RepoRoot(), "charts", "exit-guard"),
			"--namespace", releaseNS, "--create-namespace", "--wait", "--timeout", "4m"}, nodeValues()...)...)
		installed.took = time.Since(start)
		if err != nil {
			installed.err = fmt.Sprintf("helm install: %v\n%s%s", err, out, cluster.Logs("kubelet"))
		}
	})
	if installed.err != "" {
		t.Fatal(installed.err)
	}
}

// waitAvailable waits until the Deployment has want available replicas and no other pod.
func waitAvailable(t *testing.T, want int32) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		var d appsv1.Deployment
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: deploy}, &d); err != nil {
			return false, err
		}
		return d.Status.AvailableReplicas == want && d.Status.Replicas == want && d.Status.UpdatedReplicas == want, nil
	})
	if err != nil {
		t.Fatalf("the Deployment did not have %d available replicas: %v%s", want, err, cluster.Logs("kubelet"))
	}
}

// waitReplaced waits until two ready guard pods run, none of them in old.
func waitReplaced(t *testing.T, old []corev1.Pod) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		ready := 0
		for _, p := range guardPods(t) {
			for _, o := range old {
				if p.Name == o.Name {
					return false, nil
				}
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == 2, nil
	})
	if err != nil {
		t.Fatalf("the guard's pods were not replaced by two ready ones: %v", err)
	}
}

func guardPods(t *testing.T) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := env.Client.List(t.Context(), &pods, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/name": "exit-guard"}); err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if c := metav1.GetControllerOf(&p); p.DeletionTimestamp == nil && c != nil && c.Kind == "ReplicaSet" {
			out = append(out, p)
		}
	}
	return out
}

// TestTheChartsGuardRunsOnTheNode: helm install --wait of the chart with its defaults on the
// real node: two replicas of the guard's image run in containers, each with an address of the
// pod network, their probes pass, the Deployment is available.
func TestTheChartsGuardRunsOnTheNode(t *testing.T) {
	installChart(t)
	t.Logf("helm install --wait: %s", installed.took.Round(time.Millisecond))
	waitAvailable(t, 2)
	pods := guardPods(t)
	if len(pods) != 2 {
		t.Fatalf("%d guard pods, want 2", len(pods))
	}
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Status.PodIP == "" {
			t.Errorf("pod %s: hostNetwork %v, address %q: want a pod address", p.Name, p.Spec.HostNetwork, p.Status.PodIP)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if !cs.Ready || cs.State.Running == nil {
				t.Errorf("pod %s: container %s not running and ready: %+v", p.Name, cs.Name, cs.State)
			}
			t.Logf("pod %s (%s) on %s: container %s ready, image %s", p.Name, p.Status.PodIP, p.Spec.NodeName, cs.Name, cs.ImageID)
		}
	}
}

// TestHelmTestRunsOnTheNode: helm test runs the chart's check pod for real and passes; with
// no replica running (the webhook fails open) the same check fails.
func TestHelmTestRunsOnTheNode(t *testing.T) {
	installChart(t)
	start := time.Now()
	out := mustHelm(t, "test", release, "--namespace", releaseNS, "--logs", "--timeout", "3m")
	t.Logf("helm test: passed in %s\n%s", time.Since(start).Round(time.Millisecond), out)

	scale(t, 0)
	defer func() { scale(t, 2); waitAvailable(t, 2) }()
	waitGone(t)
	// The check sends its dry-run pod again every second for check.timeout (3m) while the guard
	// does not refuse it; helm gives up after 30 s, and the check pod has not passed.
	if out, err := helm(t, "test", release, "--namespace", releaseNS, "--timeout", "30s"); err == nil {
		t.Fatalf("helm test passed with no replica running:\n%s", out)
	} else {
		t.Logf("with no replica, helm test fails as it should: %v", err)
	}
	var check corev1.Pod
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: releaseNS, Name: deploy + "-check"}, &check); err != nil {
		t.Fatal(err)
	}
	if check.Status.Phase == corev1.PodSucceeded {
		t.Errorf("the check pod succeeded with no replica running")
	}
}

func scale(t *testing.T, n int32) {
	t.Helper()
	var d appsv1.Deployment
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: releaseNS, Name: deploy}, &d); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Replicas = &n
	if err := env.Client.Patch(t.Context(), &d, patch); err != nil {
		t.Fatal(err)
	}
}

func waitGone(t *testing.T) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/name": "exit-guard"}); err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if c := metav1.GetControllerOf(&p); c != nil && c.Kind == "ReplicaSet" {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the guard's pods did not go: %v", err)
	}
}

// evict asks the API server to evict pod, as kubectl drain does.
func evict(t *testing.T, p corev1.Pod) error {
	t.Helper()
	return env.Client.SubResource("eviction").Create(t.Context(), &p, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
	})
}

// TestAnEvictionKeepsTheWebhookServed evicts one replica as kubectl drain would, under a steady
// stream of pod creates: the PodDisruptionBudget refuses the second eviction until the first
// replica's replacement is ready, and no admission goes unjudged or fails.
func TestAnEvictionKeepsTheWebhookServed(t *testing.T) {
	installChart(t)
	waitAvailable(t, 2)
	p := startProber(t, newNamespace(t), 100*time.Millisecond)
	pods := guardPods(t)
	start := time.Now()
	if err := evict(t, pods[0]); err != nil {
		t.Fatalf("evicting %s: %v", pods[0].Name, err)
	}
	if err := evict(t, pods[1]); !apierrors.IsTooManyRequests(err) {
		t.Errorf("evicting %s right after %s: err = %v, want 429 from the PodDisruptionBudget", pods[1].Name, pods[0].Name, err)
	}
	// As kubectl drain does: ask again until the budget allows it.
	blocked := 0
	err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		err := evict(t, pods[1])
		if apierrors.IsTooManyRequests(err) {
			blocked++
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("evicting %s: %v", pods[1].Name, err)
	}
	t.Logf("the budget held the second eviction %s (%d refusals), until the first replica's replacement was ready", time.Since(start).Round(time.Millisecond), blocked)
	waitReplaced(t, pods)
	got := p.stop()
	t.Logf("two evictions, one after the other: %s (%s)", got, time.Since(start).Round(time.Millisecond))
	if got.Unjudged != 0 || got.Failed != 0 || got.Refused == 0 {
		t.Errorf("%s: want every stale exit handler refused and every step admitted\n%s", got, strings.Join(got.Errors, "\n"))
	}
}

// TestARollingUpgradeUnderLoad: helm upgrade to a changed value rolls both replicas under a
// steady stream of pod creates; no admission goes unjudged or fails.
func TestARollingUpgradeUnderLoad(t *testing.T) {
	installChart(t)
	waitAvailable(t, 2)
	before := guardPods(t)
	p := startProber(t, newNamespace(t), 100*time.Millisecond)
	start := time.Now()
	mustHelm(t, append([]string{"upgrade", release, filepath.Join(testenv.RepoRoot(), "charts", "exit-guard"),
		"--namespace", releaseNS, "--wait", "--timeout", "4m", "--set", "logging.level=debug"}, nodeValues()...)...)
	waitAvailable(t, 2)
	took := time.Since(start)
	got := p.stop()
	for _, q := range guardPods(t) {
		for _, b := range before {
			if q.Name == b.Name {
				t.Errorf("pod %s survived the upgrade: nothing rolled", q.Name)
			}
		}
	}
	t.Logf("helm upgrade --wait (logging.level=debug): %s; %s", took.Round(time.Millisecond), got)
	if got.Unjudged != 0 || got.Failed != 0 || got.Refused == 0 {
		t.Errorf("%s: want every stale exit handler refused and every step admitted\n%s", got, strings.Join(got.Errors, "\n"))
	}
}

// newNamespace makes a namespace for a test's workflows.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "wf-"}}
	if err := env.Client.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	// Pods need the namespace's default ServiceAccount (ServiceAccount admission), which
	// kube-controller-manager makes.
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "default"}, &corev1.ServiceAccount{})
		return err == nil, client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("no default ServiceAccount in %s: %v", ns.Name, err)
	}
	return ns.Name
}
