//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kubelet stands in for the kubelet, which these tests do not run: it watches the pods of a
// namespace and writes their status through the status subresource, as a kubelet would: a
// moment after creation every container running, the pod Running; after a time given by the
// pod's node every container terminated, the pod Succeeded (or Failed, for a node named
// "fail"). It records every pod it saw created. Agent pods run Argo's real agent (agents),
// when the test gives one: the pod runs as long as the agent process does.
type kubelet struct {
	c      client.Client
	ns     string
	agents *agents
	// runtime says how long a node's pod runs and whether it fails (runtimeOf unless set);
	// report, when set, reports a pod's outputs as its executor would, before the pod ends
	// (an error: the pod ends on a later round).
	runtime func(node string) (time.Duration, bool)
	report  func(ctx context.Context, pod *corev1.Pod) error

	mu   sync.Mutex
	seen map[types.UID]seenPod // by pod UID: a stale copy re-creates pods under the same name
}

type seenPod struct {
	name     string
	workflow string
	node     string
	agent    bool
	// onExit: the pod has Argo's on-exit label; meta is its metadata as created.
	onExit  bool
	meta    *metav1.ObjectMeta
	at      time.Time
	running bool
	done    bool
}

func newKubelet(c client.Client, ns string) *kubelet {
	return &kubelet{c: c, ns: ns, seen: map[types.UID]seenPod{}}
}

// runtimeOf is how long the pod of node runs, and whether it fails. The main template runs
// two pods in parallel, "a" for 12 s and "b" for 10 s: the shorter one's finish makes an
// incomplete status write shortly before the workflow completes.
func runtimeOf(node string) (time.Duration, bool) {
	switch {
	case strings.HasSuffix(node, ".a"):
		return 12 * time.Second, false
	case strings.HasSuffix(node, ".b"):
		return 10 * time.Second, false
	case strings.HasSuffix(node, ".fail"):
		return 3 * time.Second, true
	case strings.HasSuffix(node, ".flaky(0)"):
		// The first attempt of a retried step (throughput runs): it fails, the retry succeeds.
		return time.Second, true
	default:
		return time.Second, false
	}
}

func (k *kubelet) run(ctx context.Context) {
	for ctx.Err() == nil {
		var pods corev1.PodList
		if err := k.c.List(ctx, &pods, client.InNamespace(k.ns)); err == nil {
			alive := map[types.UID]bool{}
			for i := range pods.Items {
				k.step(ctx, &pods.Items[i])
				if pods.Items[i].DeletionTimestamp == nil {
					alive[pods.Items[i].UID] = true
				}
			}
			k.agents.keep(alive)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (k *kubelet) step(ctx context.Context, pod *corev1.Pod) {
	k.mu.Lock()
	s, ok := k.seen[pod.UID]
	if !ok {
		s = seenPod{name: pod.Name, workflow: pod.Labels["workflows.argoproj.io/workflow"], node: pod.Annotations["workflows.argoproj.io/node-name"], at: time.Now()}
		_, s.onExit = pod.Labels["workflows.argoproj.io/on-exit"]
		meta := pod.ObjectMeta.DeepCopy()
		meta.UID, meta.ResourceVersion, meta.ManagedFields, meta.CreationTimestamp, meta.Generation = "", "", nil, metav1.Time{}, 0
		s.meta = meta
		var err error
		if s.agent, err = k.agents.start(pod); err != nil {
			fmt.Fprintf(os.Stderr, "kubelet: starting the agent of pod %s: %v\n", pod.Name, err)
		}
		k.seen[pod.UID] = s
		dumpPod(pod)
	}
	k.mu.Unlock()
	runtime := k.runtime
	if runtime == nil {
		runtime = runtimeOf
	}
	d, fail := runtime(s.node)
	if s.done || pod.DeletionTimestamp != nil {
		return
	}
	if s.agent && s.running {
		// An agent pod runs until its agent exits.
		exited, code := k.agents.exited(pod.UID)
		if !exited {
			return
		}
		d, fail = 0, code != 0
	}
	started := metav1.NewTime(s.at)
	if !s.running {
		pod.Status.Phase = corev1.PodRunning
		pod.Status.StartTime = &started
		pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses = nil, nil
		for _, c := range pod.Spec.InitContainers {
			pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: "containerd://" + pod.Name + "-" + c.Name,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: started, FinishedAt: started}}})
		}
		for _, c := range pod.Spec.Containers {
			pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: "containerd://" + pod.Name + "-" + c.Name, Ready: true, Started: ptrTrue(),
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}})
		}
		if err := k.c.Status().Update(ctx, pod); err != nil {
			return
		}
		k.mu.Lock()
		s.running = true
		k.seen[pod.UID] = s
		k.mu.Unlock()
		return
	}
	if time.Since(s.at) < d {
		return
	}
	if k.report != nil && !s.agent {
		if err := k.report(ctx, pod); err != nil {
			fmt.Fprintf(os.Stderr, "kubelet: reporting the outputs of pod %s: %v\n", pod.Name, err)
			return
		}
	}
	now := metav1.Now()
	term := func(c corev1.Container, code int32) corev1.ContainerStatus {
		reason := "Completed"
		if code != 0 {
			reason = "Error"
		}
		return corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: "containerd://" + pod.Name + "-" + c.Name,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, StartedAt: started, FinishedAt: now}}}
	}
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.StartTime = &started
	pod.Status.InitContainerStatuses = nil
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.InitContainers {
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, term(c, 0))
	}
	for _, c := range pod.Spec.Containers {
		code := int32(0)
		if fail && c.Name == "main" {
			code = 1
			pod.Status.Phase = corev1.PodFailed
		}
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, term(c, code))
	}
	if err := k.c.Status().Update(ctx, pod); err != nil {
		return // deleted or changed meanwhile: the next round sees it again
	}
	k.mu.Lock()
	s.done = true
	k.seen[pod.UID] = s
	k.mu.Unlock()
}

// seenOf returns every pod seen for workflow.
func (k *kubelet) seenOf(workflow string) []seenPod {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []seenPod
	for _, s := range k.seen {
		if s.workflow == workflow {
			out = append(out, s)
		}
	}
	return out
}

// agentPods returns the agent pods seen for workflow.
func (k *kubelet) agentPods(workflow string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, s := range k.seen {
		if s.workflow == workflow && s.agent {
			n++
		}
	}
	return n
}

// pods returns the pods seen for workflow whose node name contains part.
func (k *kubelet) pods(workflow, part string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, s := range k.seen {
		if s.workflow == workflow && strings.Contains(s.node, part) {
			out = append(out, s.name)
		}
	}
	return out
}

// podTimes returns when the pods of workflow whose node name contains part were first seen
// (within 200 ms of their creation).
func (k *kubelet) podTimes(workflow, part string) []time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []time.Time
	for _, s := range k.seen {
		if s.workflow == workflow && strings.Contains(s.node, part) {
			out = append(out, s.at)
		}
	}
	return out
}

func ptrTrue() *bool { b := true; return &b }

// dumpPod writes a pod Argo's controller created, as it was admitted (no status, no fields the
// API server sets), into $E2E_POD_DIR when it is set: the seeds of the webhook's fuzz tests
// (webhook/testdata/argo-pods) come from there.
func dumpPod(pod *corev1.Pod) {
	dir := os.Getenv("E2E_POD_DIR")
	if dir == "" {
		return
	}
	p := pod.DeepCopy()
	p.Status = corev1.PodStatus{}
	p.UID, p.ResourceVersion, p.ManagedFields, p.CreationTimestamp, p.Generation = "", "", nil, metav1.Time{}, 0
	raw, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return
	}
	_ = os.WriteFile(filepath.Join(dir, p.Name+".json"), raw, 0o600)
}
