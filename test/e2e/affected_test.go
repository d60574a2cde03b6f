//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestAmIAffected runs the reference workflows without the guard on the lines of the README's
// "Am I affected?" that the other proofs leave out: the newest 3.5 release the Go module proxy
// serves (v3.5.14: no fix on that line), the last 3.7 release before upstream's fix (v3.7.15),
// both exposed, so the guard must refuse their stale exit handlers, and the first 4.0 release
// with it (v4.0.7) with INFORMER_WRITE_BACK=true, the setting that exposes v4.0.5. It fails
// when a line does not behave as the README says.
func TestAmIAffected(t *testing.T) {
	n := tries(t)
	for _, line := range []struct {
		version string
		env     []string
		exposed bool
	}{
		{"v3.5.14", nil, true},
		{"v3.7.15", nil, true},
		{"v4.0.7", []string{"INFORMER_WRITE_BACK=true"}, false},
	} {
		name := strings.TrimSpace(line.version + " " + strings.Join(line.env, " "))
		var without tally
		t.Run(name+" without the guard", func(t *testing.T) {
			without = report(t, name+" without the guard", runScenario(t, scenario{version: line.version, mode: noGuard, ok: n, env: line.env}))
			switch {
			case line.exposed && without.reproduced == 0:
				t.Errorf("%s: no false notice in %d tries; the README says this line is exposed", name, n)
			case !line.exposed && without.reproduced != 0:
				t.Errorf("%s: %d false notices in %d tries; the README says this line is not exposed", name, without.reproduced, n)
			}
		})
		if !line.exposed {
			continue
		}
		t.Run(name+" with the guard", func(t *testing.T) {
			said := ""
			c := report(t, name+" with the guard", runScenario(t, scenario{version: line.version, mode: guardDirect, ok: n, failing: 1, env: line.env,
				afterRun: func(_ context.Context, r rig, _ []*unstructured.Unstructured) { said = r.guardLog.String() }}))
			// The guard read the release from the executor image of the pods it judged, and
			// said it is exposed.
			if !strings.Contains(said, `"Argo Workflows release seen on the pods the guard judges"`) ||
				!strings.Contains(said, `"version":"`+line.version+`"`) || !strings.Contains(said, `"exposure":"exposed"`) {
				t.Errorf("the guard did not say it saw %s, exposed, on the pods it judged", line.version)
			}
			if c.reproduced != 0 {
				t.Errorf("%d false notifications went out with the guard on", c.reproduced)
			}
			if without.reproduced > 0 && c.refused == 0 {
				t.Errorf("no stale attempt was refused in %d tries: the guard was not shown at work", n)
			}
			if c.wrongDenials != 0 || c.failedNotified != c.failed {
				t.Errorf("failing workflows: %d of %d notified, %d wrong denials", c.failedNotified, c.failed, c.wrongDenials)
			}
		})
	}
}
