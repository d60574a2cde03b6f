//go:build envtest

package chart

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/test/support/fixture"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// TestCorpusPodsMeetTheChartsConditions creates every corpus pod (a dry run) through the real
// API server, with the chart's pod webhook registered for each guard.cover, its selector and
// match conditions as rendered, in front of a webhook that only records: the API server calls
// it for exactly the pods whose role (Argo's, from the workflow's status and spec) the
// coverage covers, as the guard's own podCovered decides.
func TestCorpusPodsMeetTheChartsConditions(t *testing.T) {
	pods, err := fixture.CorpusPods(filepath.Join(testenv.RepoRoot(), "webhook", "testdata", "corpus-pods"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	called := map[string]bool{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		var pod metav1.PartialObjectMetadata
		if err := json.Unmarshal(review.Request.Object.Raw, &pod); err != nil || pod.Name == "" {
			http.Error(w, "no pod with a name in the review", http.StatusBadRequest)
			return
		}
		mu.Lock()
		called[pod.Name] = true
		mu.Unlock()
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		_ = json.NewEncoder(w).Encode(review)
	}))
	defer srv.Close()
	caBundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	ctx := t.Context()
	ns := "corpus-conditions"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	// covers is the guard's podCovered: exit-handler and agent pods always, hooks and steps as
	// the coverage says.
	covers := func(cover, role string) bool {
		switch role {
		case "exit-handler", "agent":
			return true
		case "lifecycle-hook":
			return cover == "all" || strings.Contains(cover, "hooks")
		}
		return cover == "all" || strings.Contains(cover, "steps")
	}
	roles := map[string]int{}
	for _, cover := range []string{"all", "exit-handlers", "exit-handlers,hooks", "exit-handlers,steps"} {
		t.Run(cover, func(t *testing.T) {
			vwc, err := testenv.ChartWebhook(helm(t), "guard.cover="+strings.ReplaceAll(cover, ",", "\\,"))
			if err != nil {
				t.Fatal(err)
			}
			var hook *admissionregistrationv1.ValidatingWebhook
			for i := range vwc.Webhooks {
				if vwc.Webhooks[i].Name == "validate.exit-guard.io" {
					hook = &vwc.Webhooks[i]
				}
			}
			if hook == nil {
				t.Fatal("the chart rendered no validate.exit-guard.io webhook")
			}
			hook.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: ptr.To(srv.URL + "/validate-pod"), CABundle: caBundle}
			hook.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
			hook.FailurePolicy = ptr.To(admissionregistrationv1.Fail)
			cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "corpus-conditions"},
				Webhooks: []admissionregistrationv1.ValidatingWebhook{*hook}}
			if err := env.Client.Create(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = env.Client.Delete(context.WithoutCancel(ctx), cfg) }()
			create := func(p fixture.CorpusPod, name string) error {
				meta := *p.Metadata.DeepCopy()
				meta.Name, meta.Namespace, meta.GenerateName = name, ns, ""
				pod := &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}
				return env.Client.Create(ctx, pod, client.DryRunAll)
			}
			// The configuration takes effect within moments: wait until an exit-handler pod,
			// covered in every mode, reaches the recorder.
			var probe fixture.CorpusPod
			for _, p := range pods {
				if p.ArgoRole == "exit-handler" {
					probe = p
				}
			}
			if probe.ArgoRole == "" {
				t.Fatal("no exit-handler pod in the corpus to probe with")
			}
			n := 0
			err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				n++
				name := fmt.Sprintf("probe-%d", n)
				if err := create(probe, name); err != nil {
					return false, err
				}
				mu.Lock()
				defer mu.Unlock()
				return called[name], nil
			})
			if err != nil {
				t.Fatalf("the webhook never took effect: %v", err)
			}
			for i, p := range pods {
				name := fmt.Sprintf("%s-pod-%d", strings.ReplaceAll(cover, ",", "-"), i)
				if err := create(p, name); err != nil {
					t.Fatalf("%s: %v", p.Source, err)
				}
				mu.Lock()
				got := called[name]
				mu.Unlock()
				roles[p.ArgoRole]++
				if want := covers(cover, p.ArgoRole); got != want {
					t.Errorf("cover %s, %s pod of %s (node %q): the API server called the webhook: %v, want %v", cover, p.ArgoRole, p.Source,
						p.Metadata.Annotations["workflows.argoproj.io/node-name"], got, want)
				}
			}
		})
	}
	// Argo's corpus runs its lifecycle hooks as HTTP templates: no pod of a hook's own is in it.
	for _, r := range []string{"exit-handler", "agent", "step"} {
		if roles[r] == 0 {
			t.Errorf("no %s pod in the corpus: its conditions were not tried", r)
		}
	}
}
