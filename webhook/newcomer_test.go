package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// A kind added as a newcomer would add one (docs/development.md, "Adding a kind of object"):
// PersistentVolumeClaim creates owned by a Workflow, decided from the store first and refused
// like a step pod. Everything it is lives below, and it is registered through the same entry
// points as the guard's own kinds, for the length of TestANewcomerKind: the list of kinds and
// addKindTest. No shared file names it.

// The marker of its path, as it would stand in its file (testdata/newcomer-webhook.yaml is what
// controller-gen makes of it; hack/chartcheck's TestAKindAddedInTheCodeIsServed renders the
// chart with it):
//
//	+kubebuilder:webhook:path=/validate-persistentvolumeclaim,mutating=false,failurePolicy=ignore,sideEffects=None,groups="",resources=persistentvolumeclaims,verbs=create,versions=v1,name=validate-persistentvolumeclaim.exit-guard.io,admissionReviewVersions=v1,timeoutSeconds=5,matchPolicy=Equivalent,patch=`{"matchConditions":[{"name":"owned-by-argo-workflow","expression":"has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller && r.kind == 'Workflow' && r.apiVersion.startsWith('argoproj.io/'))"}]}`
const (
	kindClaim      objectKind = "PersistentVolumeClaim"
	roleClaim      role       = "volume-claim"
	validateClaims            = "/validate-persistentvolumeclaim"
)

var claimResource = metav1.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}

// claimFields are the only fields of a claim its reader decodes.
type claimFields struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
}

func readClaim(req *reviewRequest[claimFields]) (facts, *admission.Response) {
	if req.Resource != claimResource || req.SubResource != "" || req.Operation != admissionv1.Create {
		return facts{}, allowed(fmt.Sprintf("this path only reviews PersistentVolumeClaim creates, not %s of %s", req.Operation, resourceName(req.Resource, req.SubResource)))
	}
	if req.Object == nil {
		return facts{}, errored(http.StatusBadRequest, fmt.Errorf("malformed AdmissionReview: request.object is empty"))
	}
	meta := &req.Object.Metadata
	if meta.Namespace == "" {
		meta.Namespace = req.Namespace
	}
	f := facts{object: &claimObject{name: meta.Name}, namespace: meta.Namespace, role: roleClaim, startsWork: true}
	if ref := metav1.GetControllerOfNoCopy(meta); ref != nil && ref.Kind == argo.Kind && argo.GroupOf(ref.APIVersion) == argo.Group {
		f.owner = ref
	}
	return f, nil
}

type claimObject struct{ name string }

var claimSpec = &kindSpec{
	kind: kindClaim, path: validateClaims, read: readReview("a PersistentVolumeClaim", readClaim), rowPrefix: "P",
	roles: map[role]roleRule{roleClaim: {storeFirst: true, budget: budgetHookStep}},
	noun:  "claim", retried: "claim its volume again",
	logs:      logsOf("volume claim", "volume claim", "completed"),
	eventType: corev1.EventTypeWarning, eventDenied: contract.EventReasonDenied, eventWarned: contract.EventReasonWarned,
	rowNotOwned: "P1", rowNotWatched: "P2",
	refusals:   []contract.Reason{contract.ReasonWorkflowCompleted},
	admissions: []contract.Reason{contract.ReasonNotOwnedByWorkflow, contract.ReasonNamespaceNotWatched, contract.ReasonNotSeenCompleted, contract.ReasonWorkflowNotTerminal},
}

func (c *claimObject) spec() *kindSpec            { return claimSpec }
func (c *claimObject) refused() string            { return "volume claim " + c.name }
func (c *claimObject) eventRefused() string       { return "volume claim " + c.name + " refused" }
func (c *claimObject) logValues() []any           { return []any{"claim", c.name} }
func (c *claimObject) annotate(map[string]string) {}
func (c *claimObject) requeuedWhenRefused() bool  { return true }
func (c *claimObject) comesAfterReRunNodes() bool { return false }
func claimReview(op admissionv1.Operation, object []byte) []byte {
	return coreReviewOf("c", "PersistentVolumeClaim", "persistentvolumeclaims", op, object)
}

// claimOf is a claim of the table's workflow, owned by it unless owned is false.
func claimOf(t *testing.T, owned bool, namespace string) facts {
	t.Helper()
	meta := metav1.ObjectMeta{Name: "data", Namespace: namespace}
	if owned {
		meta.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(tableWorkflow, argo.WorkflowGVK)}
	}
	raw, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		t.Fatal(err)
	}
	_, f, resp := claimSpec.read(claimReview(admissionv1.Create, raw))
	if resp != nil {
		t.Fatalf("the claim's reader answered %+v", resp.Result)
	}
	return f
}

var claimTests = kindTest{
	doc: "testdata/newcomer-decisions.md",
	cases: func() []decisionCase {
		ns := tableWorkflow.GetNamespace()
		owned := func(t *testing.T) facts { return claimOf(t, true, ns) }
		return []decisionCase{
			{row: "P1", name: "a claim no Workflow controls", facts: func(t *testing.T) facts { return claimOf(t, false, ns) }, reason: contract.ReasonNotOwnedByWorkflow},
			{row: "P2", name: "a claim in a namespace not guarded", facts: func(t *testing.T) facts { return claimOf(t, true, "elsewhere") },
				opts: Options{Namespaces: []string{ns}}, reason: contract.ReasonNamespaceNotWatched},
			{row: "P3", name: "as 16: store empty", facts: owned, reason: contract.ReasonNotSeenCompleted, source: sourceStore, wantRow: "16"},
			{row: "P3", name: "as 17: store Running", facts: owned, store: storeRunning, reason: contract.ReasonWorkflowNotTerminal, source: sourceStore, wantRow: "17"},
			{row: "P3", name: "as 18: store Succeeded, live confirms", facts: owned, store: storeSucceeded, live: liveSucceeded, deny: true, reason: contract.ReasonWorkflowCompleted, source: sourceLive, wantRow: "6"},
		}
	},
	refusable: func(t *testing.T) facts { return claimOf(t, true, tableWorkflow.GetNamespace()) },
	review:    claimReview,
	seeds: func(*testing.F) [][]byte {
		return [][]byte{claimReview(admissionv1.Create, []byte(`{"metadata":{"name":"x"}}`))}
	},
}

// withClaims adds the newcomer to the list of kinds, and its tests, for the length of t.
func withClaims(t *testing.T) {
	saved := kinds
	kinds = append(slices.Clone(kinds), claimSpec)
	addKindTest(kindClaim, claimTests)
	t.Cleanup(func() {
		kinds = saved
		delete(kindTests, kindClaim)
	})
}

// TestANewcomerKind: a kind added in files of its own and one entry in the list of kinds is
// decided by the shared checks of every kind (its rows walked in its doc, its reasons checked
// against them, its answer in each mode), served by the one pipeline with its audit and
// metrics, and refused with the 429 Argo retries.
func TestANewcomerKind(t *testing.T) {
	withClaims(t)
	for name, check := range map[string]func(*testing.T){
		"every kind has its tests": TestEveryKindHasItsTests,
		"decision table":           TestDecisionTable,
		"walk of the rows' docs":   TestDecisionTableWalksTheDocInOrder,
		"answers by mode":          TestAnswersByMode,
		"huge and nested bodies":   TestHugeAndDeeplyNestedBodies,
	} {
		t.Run(name, check)
	}
	t.Run("its cases ran", func(t *testing.T) {
		n := 0
		for _, c := range decisionCases(t) {
			if strings.HasPrefix(c.row, "P") {
				n++
			}
		}
		if n != 5 {
			t.Errorf("%d of the newcomer's 5 cases in the shared table", n)
		}
	})
	t.Run("pipeline and metrics", func(t *testing.T) {
		g, err := newGuard(nil, storeFor(t, tableWorkflow, storeSucceeded, false), Options{})
		if err != nil {
			t.Fatal(err)
		}
		g.readLive = cannedRead(liveSucceeded, new(int))
		reg := prometheus.NewRegistry()
		if err := g.metrics.register(reg); err != nil {
			t.Fatal(err)
		}
		g.metrics.initDecisions(ModeEnforce)
		series := g.metrics.decisions.WithLabelValues(verdictDenied, string(contract.ReasonWorkflowCompleted), string(kindClaim), string(sourceLive))
		if v := value(t, series); v != 0 {
			t.Fatalf("the newcomer's refusal series starts at %v, want 0", v)
		}
		var h http.Handler = g.path(claimSpec.path, claimSpec.read)
		raw, _ := json.Marshal(map[string]any{"metadata": metav1.ObjectMeta{Name: "data", Namespace: tableWorkflow.GetNamespace(),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(tableWorkflow, argo.WorkflowGVK)}}})
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, claimSpec.path, bytes.NewReader(claimReview(admissionv1.Create, raw)))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		var rv admissionv1.AdmissionReview
		if err := json.Unmarshal(rec.Body.Bytes(), &rv); err != nil || rv.Response == nil {
			t.Fatalf("HTTP %d, no review: %v %s", rec.Code, err, rec.Body)
		}
		r := rv.Response
		if r.Allowed || r.Result == nil || r.Result.Code != http.StatusTooManyRequests || !strings.Contains(r.Result.Message, "volume claim data") {
			t.Errorf("a claim of a Succeeded workflow: allowed %v, result %+v; want refused 429, naming the claim", r.Allowed, r.Result)
		}
		if r.AuditAnnotations["kind"] != string(kindClaim) || r.AuditAnnotations["reason"] != string(contract.ReasonWorkflowCompleted) {
			t.Errorf("audit annotations %v", r.AuditAnnotations)
		}
		if v := value(t, series); v != 1 {
			t.Errorf("the newcomer's refusal series is %v after one refusal, want 1", v)
		}
	})
}
