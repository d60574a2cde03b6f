package webhook

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// corpusPod is a pod Argo's controller created in the corpus run (make e2e-corpus
// CORPUS_PODS=webhook/testdata/corpus-pods): its metadata as created, the role Argo gives it
// (its node's place in the workflow's final status and spec: test/e2e's corpusRoles, which
// reads no label) and the role the guard gave it then (its audit annotation).
type corpusPod struct {
	Source    string            `json:"source"`
	ArgoRole  string            `json:"argoRole"`
	GuardRole string            `json:"guardRole"`
	Metadata  metav1.ObjectMeta `json:"metadata"`
}

// corpusPods reads testdata/corpus-pods.
func corpusPods(t testing.TB) map[string]corpusPod {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "corpus-pods", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no pods in testdata/corpus-pods (%v): make e2e-corpus CORPUS_PODS=webhook/testdata/corpus-pods writes them", err)
	}
	out := map[string]corpusPod{}
	for _, name := range files {
		raw, err := os.ReadFile(name) //nolint:gosec // G304: the repository's own test data
		if err != nil {
			t.Fatal(err)
		}
		var p corpusPod
		if err := json.Unmarshal(raw, &p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[filepath.Base(name)] = p
	}
	return out
}

// TestArgosCorpusPodsGetArgosRoles: classify gives every pod Argo's controllers created for
// Argo's own examples the role Argo gives it, read from the workflow's status and spec, not
// from the pod's labels.
func TestArgosCorpusPodsGetArgosRoles(t *testing.T) {
	roles := map[string]int{}
	for file, p := range corpusPods(t) {
		meta := p.Metadata
		f := classify(&meta)
		roles[p.ArgoRole]++
		if string(f.role) != p.ArgoRole {
			t.Errorf("%s (%s, node %q): classify says %s, Argo %s", file, p.Source, meta.Annotations["workflows.argoproj.io/node-name"], f.role, p.ArgoRole)
		}
	}
	// Argo's corpus runs its lifecycle hooks as HTTP templates (the agent's pod): no pod of a
	// hook's own is in it; TestClassify and FuzzClassify try that role by its names.
	for _, r := range []role{roleExitHandler, roleAgent, roleStep} {
		if roles[string(r)] == 0 {
			t.Errorf("no %s pod in testdata/corpus-pods: the corpus does not try that role", r)
		}
	}
}
