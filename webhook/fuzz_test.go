package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// The fuzz targets of everything that parses a request: the AdmissionReview as the API server
// sends it (FuzzAdmissionReview, through the whole HTTP handler), the pod in it (FuzzRead), and
// the pod's metadata: labels, annotations, owner references, node names (FuzzClassify). Their
// seeds are pods that Argo's own controllers created (testdata/argo-pods, captured by the Argo
// proof with E2E_POD_DIR) and the malformed shapes below. `make fuzz` runs each for a while.

// argoPods returns the captured Argo pods of testdata/argo-pods.
func argoPods(f *testing.F) [][]byte {
	f.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "argo-pods", "*.json"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no seed pods in testdata/argo-pods: %v", err)
	}
	var out [][]byte
	for _, name := range files {
		raw, err := os.ReadFile(name) //nolint:gosec // G304: the repository's own test data
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, raw)
	}
	return out
}

// fixedReader answers live reads without an API server: "done" Succeeded, "running" Running,
// anything else 404. Its labels settle the phase; a refusal reads the whole object (Get).
type fixedReader struct{}

func (fixedReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	wf, ok := obj.(*argo.Workflow)
	if !ok {
		return fmt.Errorf("unexpected %T", obj)
	}
	switch key.Name {
	case "done":
		wf.UID, wf.Status.Phase = "uid-done", argo.PhaseSucceeded
	case "running":
		wf.UID, wf.Status.Phase = "uid-running", argo.PhaseRunning
	default:
		return errors.New("fixedReader: a Get of a workflow the List did not find")
	}
	wf.Namespace, wf.Name, wf.ResourceVersion = key.Namespace, key.Name, "7"
	return nil
}

func (fixedReader) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	l, ok := list.(*metav1.PartialObjectMetadataList)
	if !ok {
		return fmt.Errorf("unexpected %T", list)
	}
	var lo client.ListOptions
	lo.ApplyOptions(opts)
	name, _ := lo.FieldSelector.RequiresExactMatch("metadata.name")
	var uid types.UID
	var phase argo.Phase
	switch name {
	case "done":
		uid, phase = "uid-done", argo.PhaseSucceeded
	case "running":
		uid, phase = "uid-running", argo.PhaseRunning
	default:
		l.Items = nil
		return nil
	}
	l.Items = []metav1.PartialObjectMetadata{{ObjectMeta: metav1.ObjectMeta{Namespace: lo.Namespace, Name: name, UID: uid, ResourceVersion: "7",
		Labels: map[string]string{argo.LabelPhase: string(phase), argo.LabelCompleted: strconv.FormatBool(phase.Terminal())}}}}
	return nil
}

func fuzzGuard(t testing.TB, opts Options) *guard {
	t.Helper()
	store, err := completionstore.New(completionstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store.Observe(completionstore.Observation{UID: "uid-gone", Namespace: "ns", Name: "gone", ResourceVersion: "5", Deleted: true})
	g, err := newGuard(fixedReader{}, store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// reviewOf wraps a raw object in an AdmissionReview of a pod operation.
func reviewOf(op admissionv1.Operation, object []byte) []byte {
	return coreReviewOf("f-1", "Pod", "pods", op, object)
}

// coreReviewOf wraps a raw object in an AdmissionReview (uid) of an operation on a core/v1
// kind, whose resource is resource.
func coreReviewOf(uid, kind, resource string, op admissionv1.Operation, object []byte) []byte {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{
			"uid": uid, "kind": map[string]string{"version": "v1", "kind": kind},
			"resource":  map[string]string{"version": "v1", "resource": resource},
			"namespace": "ns", "operation": op, "object": json.RawMessage(object),
			"userInfo": map[string]any{"username": "system:serviceaccount:argo:argo"},
		},
	})
	return b
}

// taskSetReviewOf wraps raw objects in an AdmissionReview of a WorkflowTaskSet operation; old
// is the oldObject of an UPDATE.
func taskSetReviewOf(op admissionv1.Operation, object, old []byte) []byte {
	req := map[string]any{
		"uid": "f-2", "kind": map[string]string{"group": argo.Group, "version": argo.Version, "kind": argo.TaskSetKind},
		"resource":  map[string]string{"group": argo.Group, "version": argo.Version, "resource": argo.TaskSetResource},
		"namespace": "ns", "operation": op, "object": json.RawMessage(object),
		"userInfo": map[string]any{"username": "system:serviceaccount:argo:argo"},
	}
	if old != nil {
		req["oldObject"] = json.RawMessage(old)
	}
	b, _ := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
	return b
}

// eventReviewOf wraps a raw object in an AdmissionReview of a core/v1 Event operation.
func eventReviewOf(op admissionv1.Operation, object []byte) []byte {
	return coreReviewOf("f-3", "Event", "events", op, object)
}

// checkAnswer says what is wrong with the guard's HTTP answer to body, if anything.
func checkAnswer(body []byte, status int, raw []byte, mutating bool) error {
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(raw, &review); err != nil || review.Response == nil {
		return fmt.Errorf("HTTP %d with a body that is no AdmissionReview response (%w): %s", status, err, raw)
	}
	r := review.Response
	switch {
	case status == http.StatusOK && r.Allowed:
		if mutating && len(r.Patch) > 0 {
			var ops []jsonpatch.Operation
			if err := json.Unmarshal(r.Patch, &ops); err != nil {
				return fmt.Errorf("a patch that is not a JSON patch: %s", r.Patch)
			}
		}
		if r.Result == nil || r.Result.Message == "" {
			return fmt.Errorf("allowed with no reason: %s", raw)
		}
	case status == http.StatusOK:
		if _, ok := contract.RefusalReason(&apierrors.StatusError{ErrStatus: ptr.Deref(r.Result, metav1.Status{})}); !ok {
			return fmt.Errorf("a refusal that is not one of the guard's policy decisions, in an HTTP 200: %s", raw)
		}
	case status == http.StatusBadRequest || status == http.StatusRequestEntityTooLarge:
		if r.Allowed || r.Result == nil || r.Result.Message == "" {
			return fmt.Errorf("HTTP %d without a reason: %s", status, raw)
		}
	default:
		return fmt.Errorf("HTTP %d (a handler failure) for %q: %s", status, body, raw)
	}
	var req struct {
		Request *struct {
			UID types.UID `json:"uid"`
		} `json:"request"`
	}
	if json.Unmarshal(body, &req) == nil && req.Request != nil && req.Request.UID != "" && status == http.StatusOK && r.UID != req.Request.UID {
		return fmt.Errorf("answer uid %q for request uid %q", r.UID, req.Request.UID)
	}
	return nil
}

// FuzzAdmissionReview sends arbitrary bodies through the guard's whole HTTP handler, validating
// and mutating: every answer is an AdmissionReview, an HTTP 4xx with a reason or an HTTP 200
// that admits with a reason or refuses on the guard's policy; never a panic (HTTP 500).
func FuzzAdmissionReview(f *testing.F) {
	for _, pod := range argoPods(f) {
		for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update, admissionv1.Delete} {
			f.Add(reviewOf(op, pod))
		}
	}
	f.Add(reviewOf(admissionv1.Create, []byte(`{"metadata":{"ownerReferences":[{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"done","uid":"uid-done","controller":true},{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"running","uid":"uid-running","controller":true}],"labels":{"workflows.argoproj.io/on-exit":"true"}}}`)))
	f.Add(reviewOf(admissionv1.Create, []byte(`{"metadata":{"ownerReferences":[{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"gone","uid":"uid-gone","controller":true}],"annotations":{"workflows.argoproj.io/node-name":"gone.onExit"}}}`)))
	f.Add(reviewOf(admissionv1.Create, []byte(`{"metadata":{"ownerReferences":null,"labels":{"":""}}}`)))
	f.Add(reviewOf(admissionv1.Create, []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}`)))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v2","kind":"Other","request":{}}`))
	f.Add([]byte(`{"request":{"uid":"x","resource":{"version":"v1","resource":"pods"},"operation":"CREATE","object":"not an object"}}`))
	f.Add([]byte(strings.Repeat("[", 5000)))
	f.Add([]byte(`null`))
	f.Add([]byte{})
	// WorkflowTaskSet writes: of a completed workflow, a running one, a deleted one; cleanup;
	// malformed tasks.
	owned := func(wf, uid string) string {
		return `"ownerReferences":[{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"` + wf + `","uid":"` + uid + `"}]`
	}
	for _, wf := range [][2]string{{"done", "uid-done"}, {"running", "uid-running"}, {"gone", "uid-gone"}} {
		before := `{"metadata":{"name":"` + wf[0] + `",` + owned(wf[0], wf[1]) + `,"labels":{"workflows.argoproj.io/completed":"true"}},"spec":{}}`
		after := `{"metadata":{"name":"` + wf[0] + `",` + owned(wf[0], wf[1]) + `,"labels":{"workflows.argoproj.io/completed":"false"}},"spec":{"tasks":{"` + wf[0] + `-1":{"name":"n","http":{"url":"http://x"}}}}}`
		f.Add(taskSetReviewOf(admissionv1.Update, []byte(after), []byte(before)))
		f.Add(taskSetReviewOf(admissionv1.Update, []byte(before), []byte(after)))
		f.Add(taskSetReviewOf(admissionv1.Create, []byte(after), nil))
	}
	f.Add(taskSetReviewOf(admissionv1.Update, []byte(`{"spec":{"tasks":[]}}`), []byte(`{}`)))
	f.Add(taskSetReviewOf(admissionv1.Update, []byte(`{"metadata":{`+owned("done", "uid-done")+`},"spec":{"tasks":{"a":1}}}`), nil))
	// Events about workflows: a failure claim of each workflow, and one of another kind.
	for _, wf := range [][2]string{{"done", "uid-done"}, {"running", "uid-running"}, {"gone", "uid-gone"}} {
		ev := `{"metadata":{"name":"` + wf[0] + `.1"},"involvedObject":{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"` + wf[0] + `","uid":"` + wf[1] + `","resourceVersion":"3"},"reason":"WorkflowFailed","type":"Warning"}`
		f.Add(eventReviewOf(admissionv1.Create, []byte(ev)))
		f.Add(eventReviewOf(admissionv1.Update, []byte(ev)))
	}
	f.Add(eventReviewOf(admissionv1.Create, []byte(`{"involvedObject":{"kind":"Pod"},"reason":"WorkflowFailed"}`)))
	f.Add(eventReviewOf(admissionv1.Create, []byte(`{"involvedObject":null,"reason":7}`)))
	validate := fuzzGuard(f, Options{}).path(ValidatePath, readPodReview)
	events := fuzzGuard(f, Options{}).path(ValidateEventPath, readEventReview)
	mutate := mutatingPath(fuzzGuard(f, Options{Mode: ModeWarn}))
	taskSets := fuzzGuard(f, Options{}).path(ValidateTaskSetPath, readTaskSetReview)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, h := range []struct {
			handler  http.Handler
			mutating bool
		}{{validate, false}, {mutate, true}, {taskSets, false}, {events, false}} {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			h.handler.ServeHTTP(rec, req)
			if err := checkAnswer(body, rec.Code, rec.Body.Bytes(), h.mutating); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// FuzzClassify builds pod metadata from arbitrary labels, annotations and owner references
// (missing, several, duplicated, not controllers, of other kinds) and decides it.
func FuzzClassify(f *testing.F) {
	for _, raw := range argoPods(f) {
		var pod corev1.Pod
		if err := json.Unmarshal(raw, &pod); err != nil {
			f.Fatal(err)
		}
		ref := pod.OwnerReferences[0]
		f.Add(pod.Annotations[argo.AnnotationNodeName], pod.Labels[argo.LabelOnExit], pod.Labels[argo.LabelComponent], ref.APIVersion, ref.Kind, ref.Name, string(ref.UID), 1, true)
	}
	f.Add("wf.onExit", "", "", "argoproj.io/v1alpha1", "Workflow", "done", "uid-done", 2, true)
	f.Add("wf.hooks.running", "", "", "argoproj.io/v1alpha1", "Workflow", "done", "uid-other", 1, true)
	f.Add("", "true", "agent", "argoproj.io", "Workflow", "", "", 0, false)
	f.Add("x.onExit[0](1).hooks.y", "", "", "/", "", "running", "uid-running", 3, false)
	g := fuzzGuard(f, Options{})
	f.Fuzz(func(t *testing.T, node, onExit, component, apiVersion, kind, name, uid string, refs int, controller bool) {
		meta := &metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{}, Annotations: map[string]string{argo.AnnotationNodeName: node}}
		if onExit != "" {
			meta.Labels[argo.LabelOnExit] = onExit
		}
		if component != "" {
			meta.Labels[argo.LabelComponent] = component
		}
		for i := range refs % 4 {
			c := controller && i%2 == 0
			meta.OwnerReferences = append(meta.OwnerReferences, metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid), Controller: &c})
		}
		facts := classify(meta)
		if o := facts.owner; o != nil && (o.Kind != argo.Kind || argo.GroupOf(o.APIVersion) != argo.Group || o.Controller == nil || !*o.Controller) {
			t.Fatalf("owner %+v is not a controlling Argo Workflow", o)
		}
		switch agent := component == argo.ComponentAgent; {
		case agent != (facts.role == roleAgent):
			t.Fatalf("role %s for component %q", facts.role, component)
		case !agent && (onExit != "" || strings.Contains(node, argo.OnExitMarker)) != (facts.role == roleExitHandler):
			t.Fatalf("role %s for on-exit label %q and node %q", facts.role, onExit, node)
		}
		d := g.decide(t.Context(), facts)
		if d.deny && (facts.owner == nil || (component != "" && component != argo.ComponentAgent)) {
			t.Fatalf("refused a pod the guard does not own: %+v", d)
		}
		if d.deny && d.reason == contract.ReasonWorkflowCompleted && (name != "done" || string(facts.owner.UID) != "uid-done") {
			t.Fatalf("refused as completed a pod whose workflow is not the Succeeded one: %+v", d)
		}
	})
}

// TestHugeAndDeeplyNestedBodies: a body past controller-runtime's 7 MiB limit gets HTTP 413,
// one nested too deep for encoding/json an HTTP 400, and the memory a request may take stays a
// small multiple of the limit.
func TestHugeAndDeeplyNestedBodies(t *testing.T) {
	for _, path := range []struct {
		name   string
		h      http.Handler
		review func(object []byte) []byte
	}{
		{"pod", fuzzGuard(t, Options{}).path(ValidatePath, readPodReview), func(o []byte) []byte { return reviewOf(admissionv1.Create, o) }},
		{"WorkflowTaskSet", fuzzGuard(t, Options{}).path(ValidateTaskSetPath, readTaskSetReview), func(o []byte) []byte { return taskSetReviewOf(admissionv1.Create, o, nil) }},
		{"Event", fuzzGuard(t, Options{}).path(ValidateEventPath, readEventReview), func(o []byte) []byte { return eventReviewOf(admissionv1.Create, o) }},
	} {
		big := path.review([]byte(`{"metadata":{"annotations":{"a":"` + strings.Repeat("x", 8<<20) + `"}}}`))
		deep := path.review([]byte(strings.Repeat(`{"a":`, 20000) + `1` + strings.Repeat(`}`, 20000)))
		nearLimit := path.review([]byte(`{"metadata":{"annotations":{"a":"` + strings.Repeat("x", 6<<20) + `"}}}`))
		for _, tc := range []struct {
			name string
			body []byte
			want int
		}{
			{"a body past the limit", big, http.StatusRequestEntityTooLarge},
			{"a body nested 20,000 deep", deep, http.StatusBadRequest},
			{"a 6 MiB object, under the limit", nearLimit, http.StatusOK},
		} {
			t.Run(path.name+", "+tc.name, func(t *testing.T) {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(tc.body))
				req.Header.Set("Content-Type", "application/json")
				path.h.ServeHTTP(rec, req)
				runtime.ReadMemStats(&after)
				if rec.Code != tc.want {
					t.Errorf("HTTP %d, want %d: %.300s", rec.Code, tc.want, rec.Body)
				}
				if err := checkAnswer(tc.body, rec.Code, rec.Body.Bytes(), false); err != nil {
					t.Error(err)
				}
				// What one request allocates, against the 7 MiB it may send: a ratio, not a timing.
				if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16*7<<20 {
					t.Errorf("one request allocated %d MiB", alloc>>20)
				}
			})
		}
	}
}

// FuzzRead feeds arbitrary pod objects to the request decoder: it must never panic, and must
// either go on with metadata or answer.
func FuzzRead(f *testing.F) {
	for _, pod := range argoPods(f) {
		f.Add(pod)
	}
	f.Add([]byte(`{"metadata":{"name":"p","labels":{"workflows.argoproj.io/on-exit":"true"},"ownerReferences":[{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"w","uid":"u","controller":true}]}}`))
	f.Add([]byte(`{"metadata":null}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, raw []byte) {
		// The pod inside a review, as the API server would send it were raw a JSON value.
		body := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"f","resource":{"version":"v1","resource":"pods"},"operation":"CREATE","object":` + string(raw) + `}}`)
		_, f, resp := readPodReview(body)
		if (f.object == nil) == (resp == nil) {
			t.Fatalf("readPod returned facts %+v and response %v; want exactly one", f, resp)
		}
	})
}

// FuzzReadTaskSet feeds arbitrary WorkflowTaskSet objects, new and old, to the TaskSet path's
// decoder (its metadata, its tasks each kept raw for its digest): it must never panic, and must
// either go on with facts or answer.
func FuzzReadTaskSet(f *testing.F) {
	owned := `"ownerReferences":[{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"w","uid":"u"}]`
	f.Add([]byte(`{"metadata":{"name":"w",`+owned+`,"labels":{"workflows.argoproj.io/completed":"false"}},"spec":{"tasks":{"w-1":{"name":"n","http":{"url":"http://x"}}}}}`),
		[]byte(`{"metadata":{"name":"w",`+owned+`,"labels":{"workflows.argoproj.io/completed":"true"}},"spec":{}}`), true)
	f.Add([]byte(`{"spec":{"tasks":{"a":null,"b":[],"c":"x"}}}`), []byte(`null`), false)
	f.Add([]byte(`{"spec":{"tasks":[]}}`), []byte(`{"spec":{"tasks":{"a":{}}}}`), true)
	f.Add([]byte(`{"metadata":{"labels":null,"ownerReferences":{}}}`), []byte(``), false)
	f.Fuzz(func(t *testing.T, raw, old []byte, update bool) {
		op := admissionv1.Create
		if update {
			op = admissionv1.Update
		}
		body := taskSetReviewOf(op, raw, old)
		if !json.Valid(raw) || len(old) > 0 && !json.Valid(old) {
			// Not JSON values: the review as the API server could never send it, raw.
			body = []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"f","operation":"` + string(op) + `","object":` + string(raw) + `,"oldObject":` + string(old) + `}}`)
		}
		_, fa, resp := readTaskSetReview(body)
		if err := checkRead(fa, resp); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzReadEvent feeds arbitrary Event objects to the Event path's decoder: it must never panic,
// and must either go on with facts or answer.
func FuzzReadEvent(f *testing.F) {
	f.Add([]byte(`{"metadata":{"name":"w.1"},"involvedObject":{"apiVersion":"argoproj.io/v1alpha1","kind":"Workflow","name":"w","uid":"u","resourceVersion":"3"},"reason":"WorkflowFailed","type":"Warning"}`))
	f.Add([]byte(`{"involvedObject":null,"reason":7}`))
	f.Add([]byte(`{"involvedObject":{"kind":"Pod"},"reason":"WorkflowFailed","message":""}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		body := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"f","resource":{"version":"v1","resource":"events"},"operation":"CREATE","object":` + string(raw) + `}}`)
		_, fa, resp := readEventReview(body)
		if err := checkRead(fa, resp); err != nil {
			t.Fatal(err)
		}
	})
}

// checkRead says what is wrong with a reader's result, if anything: a nil response means go on,
// with the object read; otherwise the response is the answer, an admission with a reason or an
// HTTP 4xx with a message (the facts beside it are not used).
func checkRead(fa facts, resp *admission.Response) error {
	switch {
	case resp == nil && fa.object == nil:
		return errors.New("no response and no object read")
	case resp == nil:
		return nil
	case resp.Allowed:
		if resp.Result == nil || resp.Result.Message == "" {
			return fmt.Errorf("admitted without a reason: %+v", resp)
		}
	case resp.Result == nil || resp.Result.Code < 400 || resp.Result.Code >= 500 || resp.Result.Message == "":
		return fmt.Errorf("an answer that is neither an admission nor a 4xx with a message: %+v", resp)
	}
	return nil
}
