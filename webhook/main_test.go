//go:build envtest

package webhook

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var env *testenv.Env

// The webhook configurations of these tests are the generated ones (config/webhook, from each
// kind's marker: its rules, object selector and match conditions, as the chart renders them),
// sent only objects of the namespaces these tests make, and failing closed, so that a guard that
// is not called shows as an error.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		// Fuzzing (make fuzz, with -run '^$'): the fuzz targets need no API server, and every
		// fuzz worker process would start one of its own.
		os.Exit(m.Run())
	}
	useGuardLog()
	vwc, mwc, err := testenv.GeneratedWebhooks()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fail := admissionregistrationv1.Fail
	timeout := int32(5)
	// Only objects of the namespaces these tests make are sent, so that nothing else the API
	// server creates depends on a guard running.
	nsSel := &metav1.LabelSelector{MatchLabels: map[string]string{"exit-guard-test": "true"}}
	vwc.Name = "exit-guard-test"
	for i := range vwc.Webhooks {
		w := &vwc.Webhooks[i]
		w.NamespaceSelector, w.FailurePolicy, w.TimeoutSeconds = nsSel, &fail, &timeout
	}
	webhooks := testenv.Options{ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{vwc}}
	if mwc != nil {
		mwc.Name = "exit-guard-test"
		for i := range mwc.Webhooks {
			w := &mwc.Webhooks[i]
			w.NamespaceSelector, w.FailurePolicy, w.TimeoutSeconds = nsSel, &fail, &timeout
		}
		webhooks.MutatingWebhooks = []*admissionregistrationv1.MutatingWebhookConfiguration{mwc}
	}
	os.Exit(testenv.Main(m, webhooks, &env))
}

// harness is a guard running in a manager against the test API server.
type harness struct {
	store    *completionstore.Store
	registry *prometheus.Registry
	client   client.Client // reads argo.Workflow too
	// stop stops the guard's manager, as a SIGTERM would, and waits for it to end.
	stop func()
}

type harnessOptions struct {
	// noWatch runs the webhook with no Workflow watch: the store knows only what a test puts
	// in it, as when the guard's own watch lags behind the API server.
	noWatch bool
	// reader, when set, replaces the live client of live reads.
	reader client.Reader
	// storeTTL, when set, is the store's TTL.
	storeTTL time.Duration
	// storeClock, when set, is the store's clock.
	storeClock clock.WithTicker
}

func testScheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	s, err := argo.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// faultyReader is a client of the test API server whose reads meet a fault first: List, with
// which each live-read attempt begins (readWorkflow), and Get, of a hedge or of a refusal. A
// fault that returns an error fails the read; a nil fault reads through.
func faultyReader(t *testing.T, list, get func(context.Context) error) client.Reader {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if list != nil {
				if err := list(ctx); err != nil {
					return err
				}
			}
			return c.List(ctx, l, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if get != nil {
				if err := get(ctx); err != nil {
					return err
				}
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
}

// startGuard runs the guard until the test ends, on the address the webhooks are registered at.
func startGuard(t *testing.T, opts Options, ho harnessOptions) *harness {
	t.Helper()
	scheme := testScheme(t)
	wfObj, wfCache := completionstore.CacheByObject(opts.Namespaces)
	shutdown := 10 * time.Second
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host: env.WebhookHost, Port: env.WebhookPort, CertDir: env.WebhookCertDir,
		}),
		Cache:                   cache.Options{ByObject: map[client.Object]cache.ByObject{wfObj: wfCache}},
		GracefulShutdownTimeout: &shutdown,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{registry: prometheus.NewRegistry()}
	h.store, err = completionstore.New(completionstore.Options{TTL: ho.storeTTL, Clock: ho.storeClock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	synced := func(*http.Request) error { return nil }
	if !ho.noWatch {
		synced, err = completionstore.Watch(ctx, mgr, h.store, completionstore.WatchOptions{Registerer: h.registry})
		if err != nil {
			t.Fatal(err)
		}
	}
	opts.Registerer = h.registry
	reader := ho.reader
	if reader == nil {
		// The guard's own live client, as Setup builds it.
		if reader, err = newLiveClient(env.Config, scheme); err != nil {
			t.Fatal(err)
		}
	}
	if err := setup(mgr, reader, h.store, opts); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	h.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("guard manager: %v", err)
		}
	})
	t.Cleanup(h.stop)
	started := mgr.GetWebhookServer().StartedChecker()
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 60*time.Second, true,
		func(context.Context) (bool, error) { return started(req) == nil && synced(req) == nil, nil }); err != nil {
		t.Fatalf("guard never became ready: %v", err)
	}
	h.client, err = client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// newNamespace makes a namespace whose pods the test webhooks see.
func newNamespace(t testing.TB) string {
	return testenv.Namespace(t, env.Client, "t-", map[string]string{"exit-guard-test": "true"})
}

// userClient is a client that acts as user (impersonated), who may create, get and patch the
// Argo resource of Argo's API group in namespace, and nothing else.
func userClient(t testing.TB, namespace, user, resource string) client.Client {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: user},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{argo.Group}, Resources: []string{resource}, Verbs: []string{"create", "get", "patch"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createWorkflow creates a workflow on the test API server and, when phase is set, writes it
// the way Argo does.
func createWorkflow(t testing.TB, namespace, name string, phase argo.Phase) *unstructured.Unstructured {
	t.Helper()
	return testenv.CreateWorkflow(t, env.Client, namespace, name, phase)
}

// setPhase writes the workflow's phase the way Argo's controller does.
func setPhase(t testing.TB, wf *unstructured.Unstructured, phase argo.Phase) {
	t.Helper()
	testenv.SetPhase(t, env.Client, wf, phase)
}

// waitEvent polls for a guard Event of reason about the workflow wf in namespace.
func waitEvent(t *testing.T, namespace string, wf client.Object, reason string) eventsv1.Event {
	t.Helper()
	return testenv.WaitEvent(t, env.Client, testenv.EventsAbout{Namespace: namespace, Name: wf.GetName(), UID: wf.GetUID(), Reason: reason})
}

// counter reads a counter (or a histogram's count) of the guard's registry: the sum of the
// series whose labels match.
func (h *harness) counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return gathered(t, h.registry, name, labels)
}
