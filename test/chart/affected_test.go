//go:build envtest

package chart

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// runAffected runs `exit-guard affected` as a ServiceAccount of ns whose Role has verbs on
// Deployments and ConfigMaps there, and nothing else; it returns the output and exit status.
func runAffected(t *testing.T, ns string, verbs []string, args ...string) (string, int) {
	t.Helper()
	sa := "affected-reader"
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa + "-" + strings.Join(verbs, "-")},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: verbs},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: verbs},
		}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}}}
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(t.Context(), o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, kubeconfigAs(t, ns, sa), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), guardBin, append([]string{"affected"}, args...)...) //nolint:gosec // G204: the binary this test built
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kc)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	default:
		t.Fatalf("exit-guard affected: %v\n%s", err, out)
		return "", -1
	}
}

// createAll creates rendered objects in ns.
func createAll(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		o.SetNamespace(ns)
		if err := env.Client.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
}

// upstreamController creates upstream's workflow-controller Deployment (Argo's own manifests)
// in ns at image tag, with edit applied first.
func upstreamController(t *testing.T, ns, tag string, edit func(*appsv1.Deployment)) {
	t.Helper()
	dep := convert[appsv1.Deployment](t, decodeAll(t, upstreamControllerDeployment(t))[0])
	dep.Namespace = ns
	// As upstream's install.yaml of a release has it: the controller's image at that release.
	dep.Spec.Template.Spec.Containers[0].Image = "quay.io/argoproj/workflow-controller:" + tag
	if edit != nil {
		edit(dep)
	}
	if err := env.Client.Create(t.Context(), dep); err != nil {
		t.Fatal(err)
	}
}

// TestAffectedBeforeInstall runs `exit-guard affected` against Deployments shaped as upstream's
// install.yaml, the argo-workflows chart (argo-helm) and Kubeflow Pipelines install them, with
// no guard installed and a user who may only read Deployments and ConfigMaps: its verdict, its
// reason and fix, the requester it names, and its exit status.
func TestAffectedBeforeInstall(t *testing.T) {
	read := []string{"get", "list"}
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, ns string)
		code   int
		want   []string
		reject []string
	}{
		{"upstream 3.6", func(t *testing.T, ns string) { upstreamController(t, ns, "v3.6.18", nil) },
			1, []string{"/workflow-controller: AFFECTED", "Argo Workflows v3.6.18 has no fix", "upgrade Argo to v3.7.16 or v4.0.7", "found by: upstream's install.yaml labels", "guard.expectedRequester=system:serviceaccount:%s:argo"}, nil},
		{"upstream 3.7.18, one controller", func(t *testing.T, ns string) { upstreamController(t, ns, "v3.7.18", nil) },
			0, []string{"not affected", "carries upstream's fix", "Verdict: not affected"}, []string{"expectedRequester"}},
		{"upstream 4.0.7, leader election off, rolling update (#16034)", func(t *testing.T, ns string) {
			upstreamController(t, ns, "v4.0.7", func(d *appsv1.Deployment) {
				d.Spec.Template.Spec.Containers[0].Env = append(d.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "LEADER_ELECTION_DISABLE", Value: "true"})
			})
		}, 1, []string{"AFFECTED", "strategy RollingUpdate", "two controllers run at once", "argo-workflows#16034", "Recreate"}, nil},
		{"argo-helm release argo, 3.7.18, one replica", func(t *testing.T, ns string) {
			createAll(t, ns, decodeAll(t, runHelm(t, "template", "argo", filepath.Join("testdata", "argo-workflows-standin"), "--set", "controller.imageTag=v3.7.18")))
		}, 0, []string{"/argo-argo-workflows-workflow-controller: not affected", "strategy Recreate", "LEADER_ELECTION_DISABLE=true", "found by: the argo-workflows chart's labels"}, nil},
		{"argo-helm release argo-workflows, 4.0.5 with write-back", func(t *testing.T, ns string) {
			createAll(t, ns, decodeAll(t, runHelm(t, "template", "argo-workflows", filepath.Join("testdata", "argo-workflows-standin"),
				"--set", "controller.imageTag=v4.0.5", "--set", "controller.replicas=2",
				"--set", "controller.extraEnv[0].name=INFORMER_WRITE_BACK", "--set-string", "controller.extraEnv[0].value=true")))
		}, 1, []string{"/argo-workflows-workflow-controller: AFFECTED", "INFORMER_WRITE_BACK=true sends stale passes", "upgrade Argo to v4.0.7",
			"guard.expectedRequester=system:serviceaccount:%s:argo-workflows-workflow-controller"}, nil},
		{"Kubeflow Pipelines 2.15.0 (Argo v3.7.3)", func(t *testing.T, ns string) {
			upstreamController(t, ns, "v3.7.3", func(d *appsv1.Deployment) {
				// Kubeflow Pipelines' kustomization labels every object, selectors included.
				d.Labels = map[string]string{"application-crd-id": "kubeflow-pipelines"}
				d.Spec.Selector.MatchLabels["application-crd-id"] = "kubeflow-pipelines"
				d.Spec.Template.Labels["application-crd-id"] = "kubeflow-pipelines"
			})
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pipeline-install-config",
				Labels: map[string]string{"application-crd-id": "kubeflow-pipelines"}}, Data: map[string]string{"appName": "pipeline", "appVersion": "2.15.0"}}
			if err := env.Client.Create(t.Context(), cm); err != nil {
				t.Fatal(err)
			}
		}, 1, []string{"AFFECTED", "Argo Workflows v3.7.3 has no fix", "upgrade Argo to v3.7.16", "the one Kubeflow Pipelines 2.15.0 bundles", "install exit-guard beside the bundled Argo"}, nil},
		{"a controller image without a release", func(t *testing.T, ns string) { upstreamController(t, ns, "latest", nil) },
			3, []string{"cannot tell", "names no release", "Verdict: cannot tell"}, nil},
		{"no controller", func(*testing.T, string) {}, 3, []string{"No Argo Workflows controller found in namespace"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t, nil)
			tc.setup(t, ns)
			out, code := runAffected(t, ns, read, "--namespace", ns)
			if code != tc.code {
				t.Errorf("exit status %d, want %d\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if strings.Contains(w, "%s") {
					w = strings.ReplaceAll(w, "%s", ns)
				}
				if !strings.Contains(out, w) {
					t.Errorf("the output lacks %q:\n%s", w, out)
				}
			}
			for _, r := range tc.reject {
				if strings.Contains(out, r) {
					t.Errorf("the output has %q:\n%s", r, out)
				}
			}
		})
	}

	t.Run("get alone, the controller named", func(t *testing.T) {
		ns := newNamespace(t, nil)
		upstreamController(t, ns, "v3.4.17", nil)
		if out, code := runAffected(t, ns, []string{"get"}, "--namespace", ns); code != 2 || !strings.Contains(out, "forbidden") {
			t.Errorf("without list, looking for controllers: exit %d, want 2 with the API server's refusal\n%s", code, out)
		}
		out, code := runAffected(t, ns, []string{"get"}, "--controller", ns+"/workflow-controller")
		if code != 1 || !strings.Contains(out, "Argo Workflows v3.4.17 has no fix") {
			t.Errorf("with get and the controller named: exit %d, want 1 (affected)\n%s", code, out)
		}
	})
}
