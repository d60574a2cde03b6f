//go:build e2e

// Package scheduling proves where the chart's replicas land, with Kubernetes' own
// kube-scheduler and kube-controller-manager (its Deployment and ReplicaSet controllers) against
// the real API server: Node objects stand in for machines, and the only stand-in is the step a
// kubelet takes, marking a bound pod Running and Ready so that a rolling update can go on.
package scheduling

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Options{}, &env))
}

// controlPlane starts kube-controller-manager (the Deployment and ReplicaSet controllers) and
// kube-scheduler against the test API server, and stops them when the test ends.
func controlPlane(t *testing.T) {
	t.Helper()
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := t.TempDir()
	for _, c := range []struct {
		bin  string
		args []string
	}{
		{"kube-controller-manager", []string{"--controllers=deployment,replicaset", "--leader-elect=false", "--secure-port=0", "--kubeconfig=" + kc}},
		{"kube-scheduler", []string{"--leader-elect=false", "--secure-port=0", "--kubeconfig=" + kc}},
	} {
		bin := filepath.Join(assets, c.bin)
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("no %s at %s: run 'make e2e-scheduling' (hack/envtest-binaries.sh ensure-scheduler builds it from Go modules, about 20 minutes for both the first time)", c.bin, bin)
		}
		log, err := os.Create(filepath.Join(logs, c.bin+".log"))
		if err != nil {
			t.Fatal(err)
		}
		p, err := testenv.Launch(bin, c.args, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = p.Stop(10 * time.Second)
			_ = log.Close()
			if t.Failed() {
				out, _ := os.ReadFile(log.Name())
				t.Logf("%s's log, its last lines:\n%s", c.bin, tail(string(out), 30))
			}
		})
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// node is a Node object with room for cpu millicores, optionally tainted.
type node struct {
	name   string
	cpu    string
	taints []corev1.Taint
}

// addNodes creates the nodes, Ready, and deletes them when the test ends (the Node objects of
// one test must not be another's).
func addNodes(t *testing.T, nodes ...node) {
	t.Helper()
	ctx := t.Context()
	for _, n := range nodes {
		obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{"kubernetes.io/hostname": n.name}},
			Spec: corev1.NodeSpec{Taints: n.taints}}
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		room := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(n.cpu), corev1.ResourceMemory: resource.MustParse("8Gi"),
			corev1.ResourcePods: resource.MustParse("110")}
		obj.Status = corev1.NodeStatus{Capacity: room, Allocatable: room,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}}
		if err := env.Client.Status().Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
		// The API server taints a new Node not-ready (TaintNodesByCondition) until the node
		// lifecycle controller sees it Ready and lifts the taint, as it is done here.
		obj.Spec.Taints = n.taints
		if err := env.Client.Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}})
		}
	})
}

// install renders the chart's Deployment and ServiceAccount (helm template, the chart's
// defaults and set) into a new namespace and creates them; the webhooks are left out, so no
// pod create is sent anywhere.
func install(t *testing.T, set ...string) (ns string, deploy *appsv1.Deployment) {
	t.Helper()
	ns = fmt.Sprintf("spread-%d", time.Now().UnixNano()%1e9)
	if err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	helm, err := testenv.HelmBin()
	if err != nil {
		t.Fatalf("the spread test renders the chart with helm: %v", err)
	}
	args := []string{"template", "eg", filepath.Join(testenv.RepoRoot(), "charts", "exit-guard"), "--namespace", ns,
		"--kube-version", testenv.KubeVersion(), "--show-only", "templates/deployment.yaml", "--show-only", "templates/serviceaccount.yaml"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), helm, args...) //nolint:gosec // G204: the pinned helm of this repository
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	for doc := range strings.SplitSeq(string(out), "\n---") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind == "" {
			continue
		}
		var obj client.Object
		switch meta.Kind {
		case "Deployment":
			deploy = &appsv1.Deployment{}
			obj = deploy
		case "ServiceAccount":
			obj = &corev1.ServiceAccount{}
		default:
			continue
		}
		if err := yaml.Unmarshal([]byte(doc), obj); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
	}
	if deploy == nil {
		t.Fatalf("the chart rendered no Deployment\n%s", out)
	}
	// No Pending replica of this case should land on the next case's nodes (each case lists only
	// its own namespace's pods either way).
	t.Cleanup(func() {
		var live appsv1.Deployment
		if env.Client.Get(context.Background(), client.ObjectKeyFromObject(deploy), &live) == nil {
			live.Spec.Replicas = new(int32)
			_ = env.Client.Update(context.Background(), &live)
		}
	})
	return ns, deploy
}

// kubelet does the two steps of a kubelet the Deployment controller waits for: a pod bound to a
// node becomes Running and Ready, and a deleted one goes. Pods stay where the scheduler put them.
func kubelet(ctx context.Context, t *testing.T, ns string) {
	go func() {
		for ctx.Err() == nil {
			var pods corev1.PodList
			if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err == nil {
				for i := range pods.Items {
					p := &pods.Items[i]
					if p.DeletionTimestamp != nil {
						_ = env.Client.Delete(ctx, p, client.GracePeriodSeconds(0))
						continue
					}
					if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodRunning {
						continue
					}
					now := metav1.Now()
					p.Status.Phase = corev1.PodRunning
					p.Status.Conditions = append(p.Status.Conditions,
						corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
						corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now})
					if err := env.Client.Status().Update(ctx, p); err != nil && ctx.Err() == nil {
						t.Logf("marking %s ready: %v", p.Name, err)
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

// placement is where the Deployment's current pods are: node names of the bound ones, sorted,
// and the names of those the scheduler left Pending with its reason.
type placement struct {
	nodes   []string
	pending map[string]string
}

func (p placement) String() string {
	return fmt.Sprintf("bound to %v, pending %v", p.nodes, p.pending)
}

// place waits until the Deployment's pods of its newest ReplicaSet number replicas and each is
// bound or found unschedulable, with no old pod left, and returns their placement.
func place(t *testing.T, ns string, d *appsv1.Deployment) placement {
	t.Helper()
	var last placement
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		var live appsv1.Deployment
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(d), &live); err != nil {
			return false, nil //nolint:nilerr // retried until the deadline
		}
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return false, nil //nolint:nilerr // retried until the deadline
		}
		last = placement{pending: map[string]string{}}
		hashes := map[string]bool{}
		decided := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				return false, nil
			}
			hashes[p.Labels["pod-template-hash"]] = true
			if p.Spec.NodeName != "" {
				last.nodes = append(last.nodes, p.Spec.NodeName)
				decided++
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
					last.pending[p.Name] = c.Message
					decided++
				}
			}
		}
		slices.Sort(last.nodes)
		want := int(*d.Spec.Replicas)
		return len(pods.Items) == want && decided == want && len(hashes) == 1 && live.Status.ObservedGeneration == live.Generation, nil
	})
	if err != nil {
		t.Fatalf("the replicas did not settle: %s", last)
	}
	return last
}

// distinct reports whether no two bound replicas share a node.
func (p placement) distinct() bool {
	return len(slices.Compact(slices.Clone(p.nodes))) == len(p.nodes)
}

var controlPlaneTaint = corev1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}

// TestReplicasSpreadAcrossNodes: the chart's default spread, placed by the real scheduler.
// The cases run one after another, each with its own nodes.
func TestReplicasSpreadAcrossNodes(t *testing.T) {
	controlPlane(t)
	t.Run("two nodes, one replica each", func(t *testing.T) {
		addNodes(t, node{name: "a1", cpu: "4"}, node{name: "a2", cpu: "4"})
		ns, d := install(t)
		if p := place(t, ns, d); len(p.nodes) != 2 || !p.distinct() {
			t.Errorf("two replicas on two nodes: %s, want one a node", p)
		}
	})
	t.Run("a full node: the second replica waits rather than share", func(t *testing.T) {
		// b2 has no room left for the guard's CPU request: a soft spread would put both
		// replicas on b1, where one machine takes both down.
		addNodes(t, node{name: "b1", cpu: "4"}, node{name: "b2", cpu: "10m"})
		ns, d := install(t)
		p := place(t, ns, d)
		if len(p.nodes) != 1 || p.nodes[0] != "b1" || len(p.pending) != 1 {
			t.Errorf("a full second node: %s, want one replica on b1 and one Pending", p)
		}
		for _, msg := range p.pending {
			if !strings.Contains(msg, "topology spread") {
				t.Errorf("the pending replica's reason %q names no topology spread", msg)
			}
		}
	})
	t.Run("a tainted node does not count", func(t *testing.T) {
		// A control-plane node the guard does not tolerate is no place for a replica, and no
		// domain the spread must fill: both replicas run on the one node that may take them.
		addNodes(t, node{name: "c1", cpu: "4"}, node{name: "c2", cpu: "4", taints: []corev1.Taint{controlPlaneTaint}})
		ns, d := install(t)
		if p := place(t, ns, d); len(p.nodes) != 2 || p.nodes[0] != "c1" || p.nodes[1] != "c1" {
			t.Errorf("one untainted node of two: %s, want both replicas on c1", p)
		}
	})
	t.Run("a rolling update keeps one replica a node", func(t *testing.T) {
		// The update's new replicas are spread among themselves (matchLabelKeys: the
		// pod-template-hash): counted with the old ones, the second new replica ties and may
		// land beside the first. Six updates make a tie that lands badly likely (seen at the
		// fourth with either part left out).
		addNodes(t, node{name: "d1", cpu: "4"}, node{name: "d2", cpu: "4"})
		ns, d := install(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		kubelet(ctx, t, ns)
		if p := place(t, ns, d); !p.distinct() || len(p.nodes) != 2 {
			t.Fatalf("before the updates: %s", p)
		}
		for i := range 6 {
			var live appsv1.Deployment
			if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(d), &live); err != nil {
				t.Fatal(err)
			}
			if live.Spec.Template.Annotations == nil {
				live.Spec.Template.Annotations = map[string]string{}
			}
			live.Spec.Template.Annotations["test/revision"] = fmt.Sprint(i)
			if err := env.Client.Update(t.Context(), &live); err != nil {
				t.Fatal(err)
			}
			d = &live
			if p := place(t, ns, d); len(p.nodes) != 2 || !p.distinct() {
				t.Fatalf("after update %d: %s, want one replica a node", i+1, p)
			}
		}
	})
	t.Run("a single node takes both", func(t *testing.T) {
		addNodes(t, node{name: "e1", cpu: "4"})
		ns, d := install(t)
		if p := place(t, ns, d); len(p.nodes) != 2 {
			t.Errorf("a single node: %s, want both replicas on it", p)
		}
	})
}
