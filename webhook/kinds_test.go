package webhook

import (
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// kindTest is what one kind's tests give the checks that every kind goes through: the walk of
// its rows (TestDecisionTable, TestDecisionTableWalksTheDocInOrder), its answer in each mode
// (TestAnswersByMode), its requests at and past the size limit (TestHugeAndDeeplyNestedBodies)
// and its fuzz seeds (FuzzAdmissionReview). A kind adds its own in a file of its own, with
// addKindTest; the checks loop over kinds.
type kindTest struct {
	// cases are the cases of its rows, in their order in doc.
	cases func() []decisionCase
	// doc is the file, from the package's folder, whose tables hold its rows: by default
	// ../docs/decisions.md.
	doc string
	// refusable is an object of its kind that its rows can refuse, read as its path reads it.
	refusable func(t *testing.T) facts
	// review is a review of its path about object, as the API server would send it for op.
	review func(op admissionv1.Operation, object []byte) []byte
	// seeds are reviews of its path for FuzzAdmissionReview.
	seeds func(f *testing.F) [][]byte
}

// kindTests are the kinds' own tests, by kind.
var kindTests = map[objectKind]kindTest{}

// addKindTest adds the tests of kind; its result is only there to let a file add them in a
// declaration of its own (var _ = addKindTest(...)).
func addKindTest(kind objectKind, kt kindTest) struct{} {
	if kt.doc == "" {
		kt.doc = "../docs/decisions.md"
	}
	kindTests[kind] = kt
	return struct{}{}
}

// testOf is k's tests; a kind that has none fails the test that asks.
func testOf(t testing.TB, k *kindSpec) kindTest {
	t.Helper()
	kt, ok := kindTests[k.kind]
	if !ok || kt.cases == nil || kt.refusable == nil || kt.review == nil || kt.seeds == nil {
		t.Fatalf("kind %s has no complete kindTest: add one in its own test file with addKindTest (docs/development.md, \"Adding a kind of object\")", k.kind)
	}
	return kt
}

// TestEveryKindHasItsTests: each kind in kinds gives the shared checks its cases, an object to
// refuse, its reviews and its seeds, and has a path; a kindTest of no kind is caught too.
func TestEveryKindHasItsTests(t *testing.T) {
	paths := map[string]objectKind{}
	for _, k := range kinds {
		testOf(t, k)
		for _, p := range []string{k.path, k.markPath} {
			if p == "" {
				continue
			}
			if other, dup := paths[p]; dup {
				t.Errorf("kinds %s and %s both serve %s", other, k.kind, p)
			}
			paths[p] = k.kind
		}
		if k.path == "" || k.read == nil {
			t.Errorf("kind %s has no path or no reader: setup would serve nothing for it", k.kind)
		}
	}
	for kind := range kindTests {
		found := false
		for _, k := range kinds {
			found = found || k.kind == kind
		}
		if !found {
			t.Errorf("tests were added for kind %s, which is not in kinds", kind)
		}
	}
}
