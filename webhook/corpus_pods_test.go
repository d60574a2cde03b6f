package webhook

import (
	"path/filepath"
	"testing"

	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// TestArgosCorpusPodsGetArgosRoles: classify gives every pod Argo's controllers created for
// Argo's own examples the role Argo gives it, read from the workflow's status and spec, not
// from the pod's labels.
func TestArgosCorpusPodsGetArgosRoles(t *testing.T) {
	pods, err := fixture.CorpusPods(filepath.Join("testdata", "corpus-pods"))
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]int{}
	for _, p := range pods {
		meta := p.Metadata
		f := classify(&meta)
		roles[p.ArgoRole]++
		if string(f.role) != p.ArgoRole {
			t.Errorf("%s (%s, node %q): classify says %s, Argo %s", p.File, p.Source, meta.Annotations["workflows.argoproj.io/node-name"], f.role, p.ArgoRole)
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
