package chartcheck

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var update = flag.Bool("update", false, "write the generated files (examples/sidecar-values.yaml) from the chart (make manifests)")

// sidecarExample is examples/sidecar-values.yaml: what the chart renders into its sidecar
// ConfigMap for the default values, release exit-guard in argo.
var sidecarExample = filepath.Join(testenv.RepoRoot(), "examples", "sidecar-values.yaml")

// TestSidecarExampleIsTheChartsRender keeps examples/sidecar-values.yaml the chart's own render
// of the sidecar values (installMode=sidecar, the ConfigMap <fullname>-sidecar), so that the
// file a user copies and the one the chart prints for their values are the same container.
func TestSidecarExampleIsTheChartsRender(t *testing.T) {
	bin, err := testenv.HelmBin()
	if err != nil {
		t.Fatalf("this check needs helm: %v", err)
	}
	args := []string{"template", "exit-guard", chartDir, "--namespace", "argo", "--kube-version", testenv.KubeVersion(),
		"--set", "installMode=sidecar", "--show-only", "templates/sidecar.yaml"}
	cmd := exec.Command(bin, args...) //nolint:gosec // G204: the pinned helm of this repository
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(stdout.Bytes(), &cm); err != nil {
		t.Fatal(err)
	}
	got, ok := cm.Data["argo-workflows-values.yaml"]
	if cm.Kind != "ConfigMap" || !ok {
		t.Fatalf("the sidecar render is a %s without argo-workflows-values.yaml:\n%s", cm.Kind, stdout.String())
	}
	if *update {
		if err := os.WriteFile(sidecarExample, []byte(got), 0o644); err != nil { //nolint:gosec // G306: a file of the repository
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(sidecarExample)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Errorf("%s is not what the chart renders for the sidecar: run make manifests", sidecarExample)
	}
}
