//go:build envtest

package chart

import (
	"strings"
	"testing"

	"k8s.io/client-go/discovery"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// TestTheAPIServerIsTheVersionRenderedFor holds the API server the tests run against to the
// version the chart is rendered for (helm --kube-version): make compat runs the chart's tests on
// each Kubernetes minor the chart supports, and a run on other binaries than it says would
// claim a minor it never tried.
func TestTheAPIServerIsTheVersionRenderedFor(t *testing.T) {
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimPrefix(v.GitVersion, "v"), testenv.KubeVersion(); got != want {
		t.Fatalf("the API server is %s, the chart is rendered for %s: set KUBEBUILDER_ASSETS and KUBE_VERSION together (make compat does)", got, want)
	}
	t.Logf("kube-apiserver %s", v.GitVersion)
}
