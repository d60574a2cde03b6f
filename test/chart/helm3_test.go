//go:build envtest && helm3

package chart

import (
	"testing"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// TestAHelm3ReleaseUpgradesUnderHelm4 is TestHelmUpgradeKeepsWhatTheGuardWrote for a release
// that Helm 3 installed before a move to the pinned Helm 4, which keeps such a release
// client-side. make compat runs it (the helm3 tag, and HELM3).
func TestAHelm3ReleaseUpgradesUnderHelm4(t *testing.T) {
	helm3, err := testenv.Helm3Bin()
	if err != nil {
		t.Fatal(err)
	}
	helmUpgradeKeepsWhatTheGuardWrote(t, helm3)
}
