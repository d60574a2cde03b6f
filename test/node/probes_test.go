//go:build node

package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// containerPids returns the processes of the container whose ID is id (containerd://…): those
// of its cgroup, found in the pids hierarchy under the node's.
func containerPids(t *testing.T, id string) []int {
	t.Helper()
	id = id[strings.Index(id, "://")+3:]
	var pids []int
	_ = filepath.WalkDir("/sys/fs/cgroup/pids/exit-guard-node/kubepods", func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() || d.Name() != id {
			return nil
		}
		raw, _ := os.ReadFile(filepath.Join(p, "cgroup.procs")) //nolint:gosec // G304: a cgroup of the node
		for f := range strings.FieldsSeq(string(raw)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return filepath.SkipAll
	})
	if len(pids) == 0 {
		t.Fatalf("found no process of container %s", id)
	}
	return pids
}

// servedBy says whether the guard's webhook Service has ip as a ready endpoint.
func servedBy(ctx context.Context, ip string) (bool, error) {
	var slices discoveryv1.EndpointSliceList
	if err := env.Client.List(ctx, &slices, client.InNamespace(releaseNS)); err != nil {
		return false, err
	}
	for _, s := range slices.Items {
		if !strings.HasSuffix(s.Labels[discoveryv1.LabelServiceName], "-webhook") {
			continue
		}
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				if a == ip && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
					return true, nil
				}
			}
		}
	}
	return false, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestProbesOnTheNode freezes one replica's guard (SIGSTOP: a hung process) under a steady
// stream of pod creates: its readiness probe fails and the pod leaves the Service's endpoints,
// then its liveness probe fails and kubelet restarts the container, which is ready again. It
// measures each step, and the admissions the frozen replica left unjudged meanwhile (the API
// server waits webhook.timeoutSeconds for it, then fails open).
func TestProbesOnTheNode(t *testing.T) {
	installChart(t)
	waitAvailable(t, 2)
	frozen := guardPods(t)[0]
	if len(frozen.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s has %d containers, want 1", frozen.Name, len(frozen.Status.ContainerStatuses))
	}
	restarts := frozen.Status.ContainerStatuses[0].RestartCount
	p := startProber(t, newNamespace(t), 100*time.Millisecond)
	start := time.Now()
	for _, pid := range containerPids(t, frozen.Status.ContainerStatuses[0].ContainerID) {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	var notReady, outOfEndpoints, restarted, readyAgain time.Duration
	var atOut tally
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		var q corev1.Pod
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&frozen), &q); err != nil {
			return false, err
		}
		switch {
		case notReady == 0 && !podReady(&q):
			notReady = time.Since(start)
		case notReady != 0 && outOfEndpoints == 0:
			if served, err := servedBy(ctx, frozen.Status.PodIP); err != nil || served {
				return false, err
			}
			outOfEndpoints, atOut = time.Since(start), p.snapshot()
		case outOfEndpoints != 0 && restarted == 0 && q.Status.ContainerStatuses[0].RestartCount > restarts:
			restarted = time.Since(start)
		case restarted != 0 && podReady(&q):
			readyAgain = time.Since(start)
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("after SIGSTOP: NotReady after %s, restarted after %s, ready again: %v%s", notReady, restarted, err, cluster.Logs("kubelet"))
	}
	// The stream goes on a little once the replica is back: both answer again.
	target := p.snapshot().Refused + 20
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return p.snapshot().Refused >= target, nil
	}); err != nil {
		t.Fatalf("the stream stopped getting answers: %s", p.snapshot())
	}
	got := p.stop()
	t.Logf("a frozen replica: NotReady after %s (readiness: every 5 s, 3 failures), out of the webhook's endpoints after %s, container restarted after %s (liveness: every 10 s, 3 failures, then SIGKILL after the grace period), ready again after %s",
		notReady.Round(100*time.Millisecond), outOfEndpoints.Round(100*time.Millisecond), restarted.Round(100*time.Millisecond), readyAgain.Round(100*time.Millisecond))
	t.Logf("admissions until it left the endpoints: %s; over the whole run: %s", atOut, got)
	if got.Failed != 0 {
		t.Errorf("%s: a step failed\n%s", got, strings.Join(got.Errors, "\n"))
	}
	// A request sent before the replica left the endpoints may still go to it; one sent after
	// must not.
	out := start.Add(outOfEndpoints)
	for _, sent := range got.UnjudgedSent {
		if sent.After(out) {
			t.Errorf("a stale exit handler sent %s after the frozen replica left the endpoints went unjudged", sent.Sub(out).Round(time.Millisecond))
		}
	}
	if got.Refused == atOut.Refused {
		t.Errorf("no stale exit handler was refused once the frozen replica left the endpoints: %s", got)
	}
}
