package webhook

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// TestExposureFollowsTheAmIAffectedTable holds each row of the README's "Am I affected?" at its
// edges.
func TestExposureFollowsTheAmIAffectedTable(t *testing.T) {
	for tag, want := range map[string]exposure{
		"v3.3.10": exposureOlder, "v3.4.0": exposureExposed, "v3.4.17": exposureExposed, "v3.5.14": exposureExposed,
		"v3.6.18": exposureExposed, "v3.7.0": exposureExposed, "v3.7.15": exposureExposed, "v3.7.16": exposureFixed,
		"v3.7.18": exposureFixed, "v4.0.0": exposureWriteBack, "v4.0.6": exposureWriteBack, "v4.0.7": exposureFixed,
		"v4.1.2": exposureFixed, "3.6.18": exposureExposed, "v3.5.14-linux-arm64": exposureExposed,
		"latest": exposureUnknown, "": exposureUnknown, "main": exposureUnknown, "sha256": exposureUnknown,
	} {
		if got := exposureOf(tag); got != want {
			t.Errorf("exposureOf(%q) = %s, want %s", tag, got, want)
		}
	}
}

func TestExecutorTagReadsTheImagesTag(t *testing.T) {
	for image, want := range map[string]string{
		"quay.io/argoproj/argoexec:v3.5.14":                        "v3.5.14",
		"registry.example.com:5000/mirror/argoexec:v3.4.17":        "v3.4.17",
		"registry.example.com:5000/mirror/argoexec":                "",
		"argoexec@sha256:" + strings.Repeat("ab", 32):              "",
		"quay.io/argoproj/argoexec:v4.0.5@sha256:0123456789abcdef": "v4.0.5",
		"argoexec:latest": "latest",
	} {
		if got := executorTag(image); got != want {
			t.Errorf("executorTag(%q) = %q, want %q", image, got, want)
		}
	}
}

// TestArgoVersionsAreSaidAndBounded: a metric series and a summary per release seen, the last
// one said; an image without a release is unknown; the series stop at maxArgoVersionsSeen.
func TestArgoVersionsAreSaidAndBounded(t *testing.T) {
	a := newArgoVersions(logr.Discard(), false)
	if s := a.summary(); s != "" {
		t.Errorf("summary before any pod: %q", s)
	}
	a.observe("")
	a.observe("quay.io/argoproj/argoexec:v3.5.14")
	a.observe("quay.io/argoproj/argoexec:v3.5.14")
	if got := gaugeOf(t, a.gauge.WithLabelValues("v3.5.14", string(exposureExposed))); got != 1 {
		t.Errorf("exit_guard_argo_exposure{version=v3.5.14,exposure=exposed} = %v, want 1", got)
	}
	if s := a.summary(); !strings.HasPrefix(s, "exit-guard: Argo Workflows v3.5.14 seen on the pods it judges: exposed (") {
		t.Errorf("summary: %q", s)
	}
	a.observe("mirror.example.com/argoexec:latest")
	if got := gaugeOf(t, a.gauge.WithLabelValues("unknown", string(exposureUnknown))); got != 1 {
		t.Errorf("an image without a release tag: unknown series %v, want 1", got)
	}
	if s := a.summary(); !strings.HasPrefix(s, "exit-guard: Argo Workflows v3.5.14 seen on the pods it judges: exposed (") || !strings.Contains(s, "2 releases seen") {
		t.Errorf("summary after a retagged image, the most exposed said: %q", s)
	}
	for i := range 40 {
		a.observe("quay.io/argoproj/argoexec:v3.4." + strings.Repeat("1", i+1))
	}
	ch := make(chan prometheus.Metric, 100)
	a.gauge.Collect(ch)
	if n := len(ch); n != maxArgoVersionsSeen {
		t.Errorf("%d series after 42 releases, want the bound %d", n, maxArgoVersionsSeen)
	}
}

// TestNoNumberOfTagsHidesAnExposedRelease: past the bound, an exposed release still counts
// (it takes the place of the least exposed), and the summary says the most exposed release
// seen, whatever came before or after it: 15 junk tags and v3.7.16 do not hide v3.5.14.
func TestNoNumberOfTagsHidesAnExposedRelease(t *testing.T) {
	a := newArgoVersions(logr.Discard(), false)
	for i := range maxArgoVersionsSeen - 1 {
		a.observe(fmt.Sprintf("example.com/junk:tag-%d", i))
	}
	a.observe("quay.io/argoproj/argoexec:v3.7.16")
	a.observe("quay.io/argoproj/argoexec:v3.5.14")
	a.observe("quay.io/argoproj/argoexec:v4.1.2")
	if s := a.summary(); !strings.HasPrefix(s, "exit-guard: Argo Workflows v3.5.14 seen on the pods it judges: exposed (") {
		t.Errorf("summary after 15 junk tags, v3.7.16, v3.5.14 and v4.1.2: %q", s)
	}
	if got := gaugeOf(t, a.gauge.WithLabelValues("v3.5.14", string(exposureExposed))); got != 1 {
		t.Errorf("exit_guard_argo_exposure{version=v3.5.14} = %v, want 1", got)
	}
	if n := len(a.seen); n != maxArgoVersionsSeen {
		t.Errorf("%d releases kept, want the bound %d", n, maxArgoVersionsSeen)
	}
	// The junk tags share the unknown series; one of them made way, the series stays.
	if got := gaugeOf(t, a.gauge.WithLabelValues("unknown", string(exposureUnknown))); got != 1 {
		t.Errorf("the unknown series = %v, want 1", got)
	}
}

// TestOnlyTheControllersPodsSayTheRelease: with an expected requester, a pod another user
// sends, or a dry run (exit-guard check, helm test), says nothing of Argo's release; the
// controller's pod does. With none, every pod but a dry run counts, and the summary says that
// anyone can add a release.
func TestOnlyTheControllersPodsSayTheRelease(t *testing.T) {
	const controller = "system:serviceaccount:argo:argo-workflows-workflow-controller"
	wf := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wf", UID: "uid-wf"}}
	send := func(h *handler, user, image string, dryRun bool) {
		t.Helper()
		pod := fixture.StepPod(wf)
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "wait", Image: image})
		raw, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		var req request
		h.handle(t.Context(), reviewBody(admissionv1.AdmissionRequest{
			UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: "ns", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
			UserInfo: authenticationv1.UserInfo{Username: user}, DryRun: &dryRun,
		}), &req)
	}
	h := fuzzGuard(t, Options{ExpectedRequester: controller}).path(ValidatePath, readPodReview)
	send(h, "system:serviceaccount:team-a:default", "quay.io/argoproj/argoexec:v3.7.16", false)
	send(h, controller, "quay.io/argoproj/argoexec:v3.7.16", true)
	if s := h.argo.summary(); s != "" {
		t.Errorf("after a tenant's pod and a dry run only: %q, want nothing said", s)
	}
	send(h, controller, "quay.io/argoproj/argoexec:v3.5.14", false)
	if s := h.argo.summary(); !strings.Contains(s, "v3.5.14 seen") || strings.Contains(s, "any requester") {
		t.Errorf("after the controller's pod: %q", s)
	}
	h = fuzzGuard(t, Options{}).path(ValidatePath, readPodReview)
	send(h, "system:serviceaccount:team-a:default", "quay.io/argoproj/argoexec:v3.5.14", false)
	if s := h.argo.summary(); !strings.Contains(s, "v3.5.14 seen") || !strings.Contains(s, "any requester") {
		t.Errorf("with no expected requester: %q, want the release and a caveat", s)
	}
}

// TestArgosVersionNeverChangesADecision sends the same pods with executor images of an exposed,
// a fixed and an unknown release: every answer is the same but for the dry run's warning, which
// says what was seen.
func TestArgosVersionNeverChangesADecision(t *testing.T) {
	wfGone := metav1.ObjectMeta{Namespace: "ns", Name: "gone", UID: "uid-gone"}
	wfDone := metav1.ObjectMeta{Namespace: "ns", Name: "done", UID: "uid-done"}
	type answer struct {
		Allowed bool
		Code    int32
		Message string
		Audit   map[string]string
	}
	var first map[string]answer
	for _, image := range []string{"quay.io/argoproj/argoexec:v3.4.17", "quay.io/argoproj/argoexec:v4.1.2", "mirror.example.com/exec:latest"} {
		h := fuzzGuard(t, Options{}).path(ValidatePath, readPodReview)
		got := map[string]answer{}
		for _, wf := range []metav1.ObjectMeta{wfGone, wfDone} {
			obj := &metav1.PartialObjectMetadata{ObjectMeta: wf}
			for name, pod := range map[string]*corev1.Pod{"exit": fixture.ExitPod(obj), "step": fixture.StepPod(obj), "agent": fixture.AgentPod(obj)} {
				pod.Name = name // the same name in every round
				pod.Spec.InitContainers = []corev1.Container{{Name: "init", Image: image}}
				pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "wait", Image: image})
				raw, err := json.Marshal(pod)
				if err != nil {
					t.Fatal(err)
				}
				var req request
				r := h.handle(t.Context(), reviewOf(admissionv1.Create, raw), &req)
				a := answer{Allowed: r.Allowed, Audit: r.AuditAnnotations}
				if r.Result != nil {
					a.Code, a.Message = r.Result.Code, r.Result.Message
				}
				got[wf.Name+"/"+name] = a
			}
		}
		if first == nil {
			first = got
			if !first["gone/exit"].Allowed && first["gone/exit"].Code != 0 {
				continue
			}
			t.Fatalf("the exit-handler pod of a deleted workflow was not refused: %+v (the test compares nothing)", first["gone/exit"])
		}
		for k, a := range got {
			if b := first[k]; a.Allowed != b.Allowed || a.Code != b.Code || a.Message != b.Message || a.Audit["decision"] != b.Audit["decision"] || a.Audit["reason"] != b.Audit["reason"] {
				t.Errorf("%s with executor %s: %+v, with v3.4.17: %+v", k, image, a, b)
			}
		}
		if s := h.argo.summary(); !strings.Contains(s, "seen on the pods it judges") {
			t.Errorf("executor %s not observed: %q", image, s)
		}
	}
}

func gaugeOf(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
