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
	return spliceReview(map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{
			"uid": uid, "kind": map[string]string{"version": "v1", "kind": kind},
			"resource":  map[string]string{"version": "v1", "resource": resource},
			"namespace": "ns", "operation": op, "object": objectSlot,
			"userInfo": map[string]any{"username": "system:serviceaccount:argo:argo"},
		},
	}, object, nil)
}

// The strings that stand for the raw object and old object in a review spliceReview marshals.
const (
	objectSlot = "\x00exit-guard-test-object\x00"
	oldSlot    = "\x00exit-guard-test-old-object\x00"
)

// spliceReview marshals review, in which objectSlot and oldSlot stand for the raw object and
// old object, and puts the raw bytes in their places verbatim (an empty one as null).
// json.Marshal would check a json.RawMessage, refuse one that is not valid JSON or nests past
// its limit, and leave an empty body: the tests must send exactly the bytes they mean to,
// malformed or deep.
func spliceReview(review map[string]any, object, old []byte) []byte {
	b, err := json.Marshal(review)
	if err != nil {
		panic(fmt.Sprintf("a review of plain values did not marshal: %v", err))
	}
	for slot, raw := range map[string][]byte{objectSlot: object, oldSlot: old} {
		quoted, err := json.Marshal(slot)
		if err != nil {
			panic(err)
		}
		if len(raw) == 0 {
			raw = []byte("null")
		}
		b = bytes.Replace(b, quoted, raw, 1)
	}
	return b
}

// taskSetReviewOf wraps raw objects in an AdmissionReview of a WorkflowTaskSet operation; old
// is the oldObject of an UPDATE.
func taskSetReviewOf(op admissionv1.Operation, object, old []byte) []byte {
	req := map[string]any{
		"uid": "f-2", "kind": map[string]string{"group": argo.Group, "version": argo.Version, "kind": argo.TaskSetKind},
		"resource":  map[string]string{"group": argo.Group, "version": argo.Version, "resource": argo.TaskSetResource},
		"namespace": "ns", "operation": op, "object": objectSlot,
		"userInfo": map[string]any{"username": "system:serviceaccount:argo:argo"},
	}
	if old != nil {
		req["oldObject"] = oldSlot
	}
	return spliceReview(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}, object, old)
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

// FuzzAdmissionReview sends arbitrary bodies through the guard's whole HTTP handler on every
// path of every kind, validating and marking: every answer is an AdmissionReview, an HTTP 4xx
// with a reason or an HTTP 200 that admits with a reason or refuses on the guard's policy;
// never a panic (HTTP 500). Each kind gives its seeds (kindTest.seeds).
func FuzzAdmissionReview(f *testing.F) {
	for _, k := range kinds {
		for _, seed := range testOf(f, k).seeds(f) {
			f.Add(seed)
		}
	}
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v2","kind":"Other","request":{}}`))
	f.Add([]byte(`{"request":{"uid":"x","resource":{"version":"v1","resource":"pods"},"operation":"CREATE","object":"not an object"}}`))
	f.Add([]byte(strings.Repeat("[", 5000)))
	f.Add([]byte(`null`))
	f.Add([]byte{})
	type path struct {
		handler  http.Handler
		mutating bool
	}
	var paths []path
	for _, k := range kinds {
		paths = append(paths, path{fuzzGuard(f, Options{}).path(k.path, k.read), false})
		if k.markPath != "" {
			paths = append(paths, path{markingPath(fuzzGuard(f, Options{Mode: ModeWarn}), k), true})
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, h := range paths {
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

// TestHugeAndDeeplyNestedBodies: a body past controller-runtime's 7 MiB limit gets HTTP 413,
// one nested too deep for encoding/json an HTTP 400, and the memory a request may take stays a
// small multiple of the limit.
func TestHugeAndDeeplyNestedBodies(t *testing.T) {
	for _, k := range kinds {
		path := struct {
			name   string
			h      http.Handler
			review func(object []byte) []byte
		}{string(k.kind), fuzzGuard(t, Options{}).path(k.path, k.read), func(o []byte) []byte { return testOf(t, k).review(admissionv1.Create, o) }}
		bigObject := []byte(`{"metadata":{"annotations":{"a":"` + strings.Repeat("x", 8<<20) + `"}}}`)
		deepObject := []byte(strings.Repeat(`{"a":`, 20000) + `1` + strings.Repeat(`}`, 20000))
		nearObject := []byte(`{"metadata":{"annotations":{"a":"` + strings.Repeat("x", 6<<20) + `"}}}`)
		big, deep, nearLimit := path.review(bigObject), path.review(deepObject), path.review(nearObject)
		for what, sent := range map[string][2][]byte{"8 MiB": {big, bigObject}, "deep": {deep, deepObject}, "6 MiB": {nearLimit, nearObject}} {
			if !bytes.Contains(sent[0], sent[1]) {
				t.Fatalf("%s: the %s object is not in the review sent (%d bytes): the test would send something else", path.name, what, len(sent[0]))
			}
		}
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
