//go:build e2e

package e2e

import (
	"strings"
	"testing"
)

// TestAmIAffected runs the reference workflows without the guard on the lines of the README's
// "Am I affected?" that the other proofs leave out: the last 3.7 release before upstream's fix
// (v3.7.15: exposed, so the guard must refuse its stale exit handlers), and the first 4.0
// release with it (v4.0.7) with INFORMER_WRITE_BACK=true, the setting that exposes v4.0.5. It
// fails when a line does not behave as the README says.
func TestAmIAffected(t *testing.T) {
	n := tries(t)
	for _, line := range []struct {
		version string
		env     []string
		exposed bool
	}{
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
			c := report(t, name+" with the guard", runScenario(t, scenario{version: line.version, mode: guardDirect, ok: n, failing: 1, env: line.env}))
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
