//go:build envtest

package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// TestTheControllersServiceAccountIsNamedRight holds docs/install.md's table of the
// controller's ServiceAccount to what each installer renders: upstream's Deployment (Argo's Go
// module), the argo-workflows chart stand-in with argo-helm's naming rule for each release and
// override the table names, and Kubeflow Pipelines (upstream's Deployment in its namespace).
// For each argo-helm release it renders this chart in sidecar mode with sidecar.argoRelease
// set to it: the RBAC binds, and guard.expectedRequester defaults to, that ServiceAccount.
func TestTheControllersServiceAccountIsNamedRight(t *testing.T) {
	table := docTable(t, "docs/install.md", "controller-serviceaccount")
	upstreamSA := convert[appsv1.Deployment](t, decodeAll(t, upstreamControllerDeployment(t))[0]).Spec.Template.Spec.ServiceAccountName
	row := regexp.MustCompile("(?m)^\\| ([^|]+) \\| `([^`]+)` \\| `system:serviceaccount:([^:`]+):([^`]+)` \\|$")
	rows := 0
	for _, line := range table {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		rows++
		how, sa, ns, requesterSA := m[1], m[2], m[3], m[4]
		if requesterSA != sa {
			t.Errorf("%s: the requester names %s, the ServiceAccount column %s", how, requesterSA, sa)
		}
		var want string
		switch {
		case strings.Contains(how, "install.yaml"):
			want = upstreamSA
			if ns != "argo" {
				t.Errorf("%s: namespace %s, want argo (the table's)", how, ns)
			}
		case strings.Contains(how, "Kubeflow Pipelines"):
			// Kubeflow Pipelines installs upstream's manifests/base Deployment in kubeflow.
			want = upstreamSA
			if ns != "kubeflow" {
				t.Errorf("%s: namespace %s, want kubeflow", how, ns)
			}
		case strings.Contains(how, "argo-workflows chart"):
			release, set := "argo-workflows", []string{}
			if r := regexp.MustCompile("release `([^`]+)`").FindStringSubmatch(how); r != nil {
				release = r[1]
			} else if o := regexp.MustCompile("`fullnameOverride: ([^`]+)`").FindStringSubmatch(how); o != nil {
				set = append(set, "--set", "fullnameOverride="+o[1])
			} else {
				t.Errorf("%s: the row names neither a release nor fullnameOverride", how)
				continue
			}
			rendered := decodeAll(t, runHelm(t, append([]string{"template", release, filepath.Join("testdata", "argo-workflows-standin")}, set...)...))
			want = convert[appsv1.Deployment](t, only(t, rendered, "Deployment")).Spec.Template.Spec.ServiceAccountName
			if len(set) == 0 {
				sidecar(t, release, want)
			}
		default:
			t.Errorf("a row of an installer the test does not know: %s", how)
			continue
		}
		if sa != want {
			t.Errorf("%s: the table says %s, the installer renders %s", how, sa, want)
		}
	}
	if rows < 6 {
		t.Errorf("docs/install.md's table has %d rows the test reads, want 6", rows)
	}
}

// sidecar renders this chart in sidecar mode for the argo-helm release and checks that its RBAC
// binds, and its guard expects requests from, the controller's ServiceAccount sa.
func sidecar(t *testing.T, release, sa string) {
	t.Helper()
	p := profile{name: "sidecar", set: []string{"installMode=sidecar", "sidecar.argoRelease=" + release}}
	objs := render(t, p, "exit-guard", "argo")
	for _, b := range find(objs, "RoleBinding") {
		binding := convert[rbacv1.RoleBinding](t, b)
		if binding.Subjects[0].Name != sa {
			t.Errorf("sidecar with argoRelease %s: RoleBinding %s binds %s, want %s", release, binding.Name, binding.Subjects[0].Name, sa)
		}
	}
	want := "--expected-requester=system:serviceaccount:argo:" + sa
	args := append([]string{"template", "exit-guard", chartDir, "--namespace", "argo", "--kube-version", testenv.KubeVersion()}, p.args()...)
	snippet := string(runHelm(t, append(args, "--show-only", "templates/sidecar.yaml")...))
	if !strings.Contains(snippet, want+"\n") {
		t.Errorf("sidecar with argoRelease %s: the container lacks %s:\n%s", release, want, snippet)
	}
}

// docTable returns the lines of the table a document marks with <!-- table: name -->, up to
// the first blank line after it.
func docTable(t *testing.T, doc, name string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), doc))
	if err != nil {
		t.Fatal(err)
	}
	marker := "<!-- table: " + name + " -->"
	at := strings.Index(string(raw), marker)
	if at < 0 {
		t.Fatalf("%s has no %s: the table the test reads is gone", doc, marker)
	}
	return strings.Split(strings.SplitN(string(raw)[at:], "\n\n", 2)[0], "\n")
}
