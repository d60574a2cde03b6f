//go:build envtest

// Package faults runs exit-guard's replicas, as the binary, behind a stand-in for their
// Service, against a real API server, and injects the faults a cluster has: rollouts, killed
// replicas, API-server restarts, expired watches, hanging reads. Every test drives admissions
// through the API server the whole time and reports what was sent, answered, failed and
// decided wrong; the webhook fails closed, so an admission lost anywhere shows as a failure.
package faults

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var (
	env      *testenv.Env
	guardBin string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "exit-guard-faults")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if guardBin, err = testenv.BuildGuard(dir); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	vwc, err := testenv.GuardWebhook()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	// Fail closed: an admission the guard did not answer is an error the load counts, not a
	// silent admission.
	fail := admissionregistrationv1.Fail
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].FailurePolicy = &fail
		vwc.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"exit-guard-faults": "true"}}
	}
	return testenv.Main(m, testenv.Options{
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{vwc},
		APIServerFlags: map[string]string{
			// Watches served from etcd, compacted every second: a watch that falls behind
			// gets 410 Gone soon, as on a busy cluster (TestWatchExpires...).
			"watch-cache":              "false",
			"etcd-compaction-interval": "1s",
			// Without it, this API server waits on the guards' open watches and does not
			// stop within envtest's timeout (TestAPIServerRestarts...).
			"shutdown-watch-termination-grace-period": "1s",
		},
	}, &env)
}

// replica is one guard process behind the balancer.
type replica struct {
	name string
	g    *testenv.Guard
	out  *testenv.Output
}

// startReplica runs a guard on a free webhook port with args, adds it to the balancer, and
// waits until it is in rotation.
func startReplica(t *testing.T, b *balancer, name string, args ...string) *replica {
	t.Helper()
	return startReplicaWith(t, b, name, env.KubeConfig(), args...)
}

// startReplicaWith is startReplica with the guard reaching the API server through kubeconfig.
func startReplicaWith(t *testing.T, b *balancer, name string, kubeconfig []byte, args ...string) *replica {
	t.Helper()
	port := strconv.Itoa(testenv.TestPort(t))
	out := &testenv.Output{}
	args = append([]string{"--webhook-port=" + port, "--webhook-cert-path=" + env.WebhookCertDir}, args...)
	g, err := testenv.StartGuard(t.Context(), guardBin, kubeconfig, args, out)
	if err != nil {
		t.Fatalf("starting replica %s: %v\n%s", name, err, out)
	}
	r := &replica{name: name, g: g, out: out}
	t.Cleanup(func() { _ = g.Kill() })
	b.add(name, net.JoinHostPort(env.WebhookHost, port), g.ProbeAddr)
	waitFor(t, "replica "+name+" in rotation", func() bool { return b.inRotation(name) })
	return r
}

// stop sends SIGTERM and waits for the replica to end. The balancer takes it out of rotation
// on its own, a propagation delay after it turned unready, as a Service does.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	if err := r.g.Stop(); err != nil {
		t.Errorf("replica %s stopped with %v\n%s", r.name, err, r.out)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("never: %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func newNamespace(t *testing.T) string {
	return testenv.Namespace(t, env.Client, "faults-", map[string]string{"exit-guard-faults": "true"})
}

func createWorkflow(t *testing.T, ns, name string, phase argo.Phase) *unstructured.Unstructured {
	t.Helper()
	return testenv.CreateWorkflow(t, env.Client, ns, name, phase)
}

// tally counts what a load sent and what came back.
type tally struct {
	sent, admitted, denied, failed, wrong atomic.Int64
	// wrongRefused: of the wrong ones, legitimate pods refused.
	wrongRefused atomic.Int64
	mu           sync.Mutex
	failures     []string // the first ten
	all          []string
}

func (c *tally) String() string {
	return "sent " + strconv.FormatInt(c.sent.Load(), 10) + ", answered " + strconv.FormatInt(c.admitted.Load()+c.denied.Load(), 10) +
		" (admitted " + strconv.FormatInt(c.admitted.Load(), 10) + ", denied " + strconv.FormatInt(c.denied.Load(), 10) +
		"), failed " + strconv.FormatInt(c.failed.Load(), 10) + ", decided wrong " + strconv.FormatInt(c.wrong.Load(), 10)
}

func (c *tally) fail(msg string) {
	c.failed.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = append(c.all, msg)
	if len(c.failures) < 10 {
		c.failures = append(c.failures, msg)
	}
}

// allFailures returns the message of every failure.
func (c *tally) allFailures() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.all)
}

// hostPort is where the API server calls the webhook: the balancer listens there.
func hostPort() string {
	return net.JoinHostPort(env.WebhookHost, strconv.Itoa(env.WebhookPort))
}

// load creates exit-handler pods (server-side dry runs) at about rate per second until ctx
// ends, half of a running workflow (to be admitted), half of a succeeded one (to be refused),
// and counts the answers. The tally it returns is filled as answers come; wait returns once
// ctx has ended and every request sent has been answered.
func load(ctx context.Context, running, succeeded *unstructured.Unstructured, workers int, rate float64) (c *tally, wait func()) {
	c = &tally{}
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) * float64(workers) / rate)
	for w := range workers {
		wg.Go(func() {
			t := time.NewTicker(interval)
			defer t.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				wf, wantDenied := running, false
				if (i+w)%2 == 1 {
					wf, wantDenied = succeeded, true
				}
				c.sent.Add(1)
				// Not ctx: a request sent is seen to its answer.
				rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := env.Client.Create(rctx, fixture.ExitPod(wf), client.DryRunAll)
				cancel()
				switch {
				case err == nil:
					c.admitted.Add(1)
					if wantDenied {
						c.wrong.Add(1)
					}
				case contract.IsRefusal(err):
					c.denied.Add(1)
					if !wantDenied {
						c.wrong.Add(1)
						c.wrongRefused.Add(1)
					}
				default:
					c.fail(err.Error())
				}
			}
		})
	}
	return c, wg.Wait
}

// sentAtLeast waits until c has sent n more requests than it had.
func (c *tally) sentAtLeast(t *testing.T, n int64) {
	t.Helper()
	target := c.sent.Load() + n
	waitFor(t, "the load to send "+strconv.FormatInt(n, 10)+" more", func() bool { return c.sent.Load() >= target })
}
