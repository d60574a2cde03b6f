//go:build envtest

package chart

import (
	"net/http"
	"testing"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// classify sends a request as the kubeconfig's user and returns the FlowSchema and priority
// level the API server's Priority and Fairness filter put it in (it names them, by UID, in
// every response, a refused one too).
func classify(t *testing.T, cfg *rest.Config, method, path string) (flowSchema, priorityLevel string) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, cfg.Host+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	// Fairness comes before authorization: a refused request is classified too.
	return resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID"), resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID")
}

// names maps the UIDs of the API server's FlowSchemas and priority levels to their names.
func names(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{"": "(none)"}
	var schemas flowcontrolv1.FlowSchemaList
	var levels flowcontrolv1.PriorityLevelConfigurationList
	if err := env.Client.List(t.Context(), &schemas); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.List(t.Context(), &levels); err != nil {
		t.Fatal(err)
	}
	for _, s := range schemas.Items {
		out[string(s.UID)] = s.Name
	}
	for _, l := range levels.Items {
		out[string(l.UID)] = l.Name
	}
	return out
}

// The chart's FlowSchema takes the guard's reads of Workflows (the live reads by name, the
// whole object, the watch and lists across namespaces) out of `service-accounts` into
// `workload-high`, as the real API server classifies them; its other requests stay where
// they were; and with apiPriority.flowSchema=false nothing changes.
func TestFlowSchemaLiftsTheGuardsReadsOfWorkflows(t *testing.T) {
	uid := func(obj client.Object, name string) string {
		t.Helper()
		if err := env.Client.Get(t.Context(), client.ObjectKey{Name: name}, obj); err != nil {
			t.Fatalf("the API server's own %T %s: %v", obj, name, err)
		}
		return string(obj.GetUID())
	}
	serviceAccounts := uid(&flowcontrolv1.FlowSchema{}, "service-accounts")
	workloadHigh := uid(&flowcontrolv1.PriorityLevelConfiguration{}, "workload-high")
	workloadLow := uid(&flowcontrolv1.PriorityLevelConfiguration{}, "workload-low")

	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "flowSchema on (the default)", false: "flowSchema off"}[on], func(t *testing.T) {
			ns := newNamespace(t, nil)
			release := map[bool]string{true: "apf", false: "apf-off"}[on]
			var extra []string
			if !on {
				extra = []string{"--set", "apiPriority.flowSchema=false"}
			}
			objs := render(t, chartCerts, release, ns, extra...)
			install(t, objs)
			schemas := find(objs, "FlowSchema")
			if on != (len(schemas) == 1) {
				t.Fatalf("rendered %d FlowSchemas, want %d", len(schemas), map[bool]int{true: 1, false: 0}[on])
			}
			want := serviceAccounts
			if on {
				want = uid(&flowcontrolv1.FlowSchema{}, schemas[0].GetName())
			}
			cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfigAs(t, ns, only(t, objs, "ServiceAccount").GetName()))
			if err != nil {
				t.Fatal(err)
			}
			wf := createWorkflow(t, ns, "Succeeded")
			for _, r := range []struct{ what, method, path, flowSchema, level string }{
				{"the live read's LIST by name", http.MethodGet, "/apis/argoproj.io/v1alpha1/namespaces/" + ns + "/workflows?fieldSelector=metadata.name%3D" + wf.GetName(), want, ""},
				{"the live read's GET", http.MethodGet, "/apis/argoproj.io/v1alpha1/namespaces/" + ns + "/workflows/" + wf.GetName(), want, ""},
				{"the watch across namespaces", http.MethodGet, "/apis/argoproj.io/v1alpha1/workflows?watch=true&timeoutSeconds=1", want, ""},
				{"the lock scan's LIST across namespaces", http.MethodGet, "/apis/argoproj.io/v1alpha1/workflows?resourceVersion=0&labelSelector=workflows.argoproj.io%2Fphase%3DPending", want, ""},
				{"a read of anything else", http.MethodGet, "/api/v1/namespaces/" + ns + "/events", serviceAccounts, workloadLow},
			} {
				fs, pl := classify(t, cfg, r.method, r.path)
				level := r.level
				if level == "" {
					level = map[bool]string{true: workloadHigh, false: workloadLow}[on]
				}
				if fs != r.flowSchema || pl != level {
					t.Errorf("%s: classified by FlowSchema %s, priority level %s; want %s, %s", r.what,
						names(t)[fs], names(t)[pl], names(t)[r.flowSchema], names(t)[level])
				}
			}
		})
	}
}
