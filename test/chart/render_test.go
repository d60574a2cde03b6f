//go:build envtest

package chart

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

func convert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		t.Fatalf("converting %s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

func TestEveryProfileLintsAndRenders(t *testing.T) {
	for _, p := range profiles {
		t.Run(p.name, func(t *testing.T) {
			runHelm(t, append([]string{"lint", chartDir, "--strict", "--kube-version", testenv.KubeVersion()}, p.args()...)...)
			objs := render(t, p, "eg", "argo")
			sidecar := strings.HasPrefix(p.name, "sidecar")
			mutating := p.name == "self-managed-warn" || p.name == "dry-run" || p.name == "warn-without-tasksets"
			// warn-without-tasksets turns the Event webhook off too: no validating webhook is left;
			// webhooks-off (the kill switch) renders none.
			taskSets := p.name != "warn-without-tasksets"
			if p.name == "webhooks-off" {
				if n := len(find(objs, "ValidatingWebhookConfiguration")) + len(find(objs, "MutatingWebhookConfiguration")); n != 0 {
					t.Errorf("webhook.enabled=false rendered %d webhook configurations", n)
				}
				if n := len(find(objs, "Deployment")); n != 1 {
					t.Errorf("webhook.enabled=false rendered %d Deployments: the guard keeps running", n)
				}
				return
			}
			if got := len(find(objs, "MutatingWebhookConfiguration")); got != map[bool]int{true: 1, false: 0}[mutating] {
				t.Errorf("%d MutatingWebhookConfigurations", got)
			}
			// Pods in enforce mode, WorkflowTaskSets and Events share the one validating configuration.
			if got := len(find(objs, "ValidatingWebhookConfiguration")); got != map[bool]int{true: 1, false: 0}[!mutating || taskSets] {
				t.Errorf("%d ValidatingWebhookConfigurations", got)
			}
			binding := convert[rbacv1.ClusterRoleBinding](t, find(objs, "ClusterRoleBinding")[0])
			svc := convert[corev1.Service](t, only(t, objs, "Service"))
			if sidecar {
				if n := len(find(objs, "Deployment")) + len(find(objs, "ServiceAccount")) + len(find(objs, "PodDisruptionBudget")); n != 0 {
					t.Errorf("sidecar mode rendered %d Deployments, ServiceAccounts or PDBs", n)
				}
				if binding.Subjects[0].Name != "argo-workflows-workflow-controller" {
					t.Errorf("sidecar RBAC bound to %q, want the controller's ServiceAccount", binding.Subjects[0].Name)
				}
				if diff := cmp.Diff(map[string]string{"app.kubernetes.io/component": "workflow-controller"}, svc.Spec.Selector); diff != "" {
					t.Errorf("sidecar Service selector (-want +got):\n%s", diff)
				}
				return
			}
			dep := convert[appsv1.Deployment](t, only(t, objs, "Deployment"))
			checkDeployment(t, p, dep)
			if binding.Subjects[0].Name != dep.Spec.Template.Spec.ServiceAccountName {
				t.Errorf("RBAC bound to %q, the pod runs as %q", binding.Subjects[0].Name, dep.Spec.Template.Spec.ServiceAccountName)
			}
			if len(find(objs, "PodDisruptionBudget")) != 1 {
				t.Error("no PodDisruptionBudget for a multi-replica Deployment")
			}
			if p.name == "everything" {
				for _, kind := range []string{"ServiceMonitor", "NetworkPolicy"} {
					if len(find(objs, kind)) != 1 {
						t.Errorf("no %s", kind)
					}
				}
				c := dep.Spec.Template.Spec.Containers[0]
				if !strings.HasSuffix(c.Image, "@sha256:"+strings.Repeat("ab", 32)) {
					t.Errorf("image %q does not use the digest", c.Image)
				}
				if dep.Labels["team"] != "platform" || dep.Annotations["owner"] != "platform-team" {
					t.Errorf("common labels/annotations missing: %v %v", dep.Labels, dep.Annotations)
				}
				for _, arg := range []string{"--cover=exit-handlers,hooks", "--hook-step-read-budget=500ms", "--deny-phases=Succeeded,Failed,Error", "--namespaces=argo,ci", "--zap-log-level=debug"} {
					if !contains(c.Args, arg) {
						t.Errorf("args %v lack %s", c.Args, arg)
					}
				}
			}
		})
	}
}

func checkDeployment(t *testing.T, p profile, dep *appsv1.Deployment) {
	t.Helper()
	spec := dep.Spec.Template.Spec
	if p.name != "everything" && *dep.Spec.Replicas != 2 {
		t.Errorf("replicas = %d, want 2 by default", *dep.Spec.Replicas)
	}
	if len(spec.TopologySpreadConstraints) == 0 || spec.TopologySpreadConstraints[0].TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("replicas are not spread across nodes: %+v", spec.TopologySpreadConstraints)
	}
	c := spec.Containers[0]
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %+v, want the guard's /readyz", c.ReadinessProbe)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation ||
		len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container security context %+v is not restricted", sc)
	}
	if psc := spec.SecurityContext; psc == nil || !*psc.RunAsNonRoot || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v is not restricted", psc)
	}
	if c.Resources.Requests.Memory().IsZero() {
		t.Error("no resource requests")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestRenderedManifestsAreAcceptedByTheAPIServer creates every rendered object of every
// profile with a server-side dry run: schema, CEL match conditions and admission included. The
// guard's pod template must also pass the restricted Pod Security profile.
func TestRenderedManifestsAreAcceptedByTheAPIServer(t *testing.T) {
	// The namespaces the "everything" profile guards, where its `helm test` RBAC goes.
	for _, ns := range []string{"argo", "ci", "monitoring"} {
		if err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, p := range profiles {
		t.Run(p.name, func(t *testing.T) {
			level := p.podSecurity
			if level == "" {
				level = "restricted"
			}
			ns := newNamespace(t, map[string]string{"pod-security.kubernetes.io/enforce": level})
			for _, o := range render(t, p, "eg-"+rand.String(4), ns) {
				if err := env.Client.Create(t.Context(), o, client.DryRunAll); err != nil {
					t.Errorf("API server refused %s %s: %v", o.GetKind(), o.GetName(), err)
				}
				if o.GetKind() != "Deployment" {
					continue
				}
				dep := convert[appsv1.Deployment](t, o)
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guard-pod", Labels: dep.Spec.Template.Labels},
					Spec: dep.Spec.Template.Spec}
				pod.Spec.PriorityClassName = ""
				if err := env.Client.Create(t.Context(), pod, client.DryRunAll); err != nil {
					t.Errorf("the guard's pod is refused in a namespace enforcing the %s profile: %v", level, err)
				}
			}
		})
	}
}

func newNamespace(t *testing.T, labels map[string]string) string {
	return testenv.Namespace(t, env.Client, "chart-", labels)
}

// TestChartMatchesTheGeneratedManifests checks the chart's webhooks and RBAC against config/,
// which controller-gen generates from the markers in the code.
func TestChartMatchesTheGeneratedManifests(t *testing.T) {
	root := testenv.RepoRoot()
	// The generated webhooks, by kind of configuration and name.
	generated := map[string]map[string]any{}
	raw, err := os.ReadFile(filepath.Join(root, "config", "webhook", "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range decodeAll(t, raw) {
		for _, w := range o.Object["webhooks"].([]any) {
			w := w.(map[string]any)
			generated[o.GetKind()+"/"+w["name"].(string)] = w
		}
	}
	// What each mode serves: in enforce mode every generated validating webhook; in warn mode
	// every mutating one, and the validating ones of the kinds that do not mark (whose rules no
	// mutating webhook has).
	served := map[string][]string{}
	for key, w := range generated {
		kind, _, _ := strings.Cut(key, "/")
		switch kind {
		case "ValidatingWebhookConfiguration":
			served["enforce"] = append(served["enforce"], key)
			marked := false
			for other, m := range generated {
				marked = marked || strings.HasPrefix(other, "MutatingWebhookConfiguration/") && cmp.Equal(m["rules"], w["rules"])
			}
			if !marked {
				served["warn"] = append(served["warn"], key)
			}
		case "MutatingWebhookConfiguration":
			served["warn"] = append(served["warn"], key)
		}
	}
	for _, p := range []profile{profiles[0], {name: "warn", set: []string{"guard.mode=warn"}}} {
		seen := map[string]bool{}
		for _, o := range render(t, p, "eg", "argo") {
			if !strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
				continue
			}
			for _, w := range o.Object["webhooks"].([]any) {
				got := w.(map[string]any)
				want, ok := generated[o.GetKind()+"/"+got["name"].(string)]
				if !ok {
					t.Errorf("%s: %s %s has no generated counterpart in config/webhook", p.name, o.GetKind(), got["name"])
					continue
				}
				seen[o.GetKind()+"/"+got["name"].(string)] = true
				for _, field := range []string{"name", "rules", "sideEffects", "admissionReviewVersions", "matchPolicy", "reinvocationPolicy", "objectSelector"} {
					if diff := cmp.Diff(want[field], got[field]); diff != "" {
						t.Errorf("%s: %s %s %s differs from config/webhook (-generated +chart):\n%s", p.name, o.GetKind(), got["name"], field, diff)
					}
				}
				// The kind's own match conditions first; the chart's coverage and the values'
				// extra ones after.
				wantConds, _ := want["matchConditions"].([]any)
				gotConds, _ := got["matchConditions"].([]any)
				if len(gotConds) < len(wantConds) || !cmp.Equal(wantConds, gotConds[:len(wantConds)]) {
					t.Errorf("%s: %s %s matchConditions %v do not begin with the generated %v", p.name, o.GetKind(), got["name"], gotConds, wantConds)
				}
				wantPath := want["clientConfig"].(map[string]any)["service"].(map[string]any)["path"]
				if gotPath := got["clientConfig"].(map[string]any)["service"].(map[string]any)["path"]; gotPath != wantPath {
					t.Errorf("%s: %s %s path %v, generated %v", p.name, o.GetKind(), got["name"], gotPath, wantPath)
				}
			}
		}
		// Every generated webhook the mode serves: a kind in the code that the chart does not
		// serve is named by what is missing.
		mode := "enforce"
		if p.name == "warn" {
			mode = "warn"
		}
		for key := range seen {
			if !slices.Contains(served[mode], key) {
				t.Errorf("%s: the chart renders %s, which %s mode does not serve", p.name, key, mode)
			}
		}
		for _, key := range served[mode] {
			if !seen[key] {
				t.Errorf("%s: the chart does not render %s, which config/webhook has: a kind in the code the chart does not serve in %s mode", p.name, key, mode)
			}
		}
		if len(seen) < 3 {
			t.Errorf("%s: %d webhooks rendered, want at least the pod's, the WorkflowTaskSet's and the Event's", p.name, len(seen))
		}
	}

	rules := func(file string) map[string][]rbacv1.PolicyRule {
		raw, err := os.ReadFile(filepath.Join(root, "config", file))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]rbacv1.PolicyRule{}
		for _, o := range decodeAll(t, raw) {
			out[o.GetKind()] = convert[rbacv1.ClusterRole](t, o).Rules
		}
		return out
	}
	guard, certRules := rules("rbac/role.yaml"), rules("rbac-certs/role.yaml")
	// The kinds of webhook configuration each mode registers, and so may update.
	for _, m := range []struct {
		p      profile
		kinds  []string
		secure bool
	}{
		{profiles[0], []string{"validatingwebhookconfigurations"}, false},
		{profile{name: "metrics.secure", set: []string{"metrics.secure=true"}}, []string{"validatingwebhookconfigurations"}, true},
		{profile{name: "warn", set: []string{"guard.mode=warn"}}, []string{"mutatingwebhookconfigurations", "validatingwebhookconfigurations"}, false},
		{profile{name: "warn, pods only", set: []string{"guard.mode=warn", "webhook.taskSets.enabled=false", "webhook.events.enabled=false"}}, []string{"mutatingwebhookconfigurations"}, false},
	} {
		objs := render(t, m.p, "eg", "argo")
		for _, o := range append(find(objs, "ClusterRole"), find(objs, "Role")...) {
			if strings.HasSuffix(o.GetName(), "-metrics-reader") {
				continue // for Prometheus's ServiceAccount, not the guard's
			}
			// TokenReviews and SubjectAccessReviews serve --metrics-secure alone.
			want := slices.DeleteFunc(slices.Clone(guard["ClusterRole"]), func(r rbacv1.PolicyRule) bool {
				return !m.secure && (slices.Contains(r.APIGroups, "authentication.k8s.io") || slices.Contains(r.APIGroups, "authorization.k8s.io"))
			})
			if strings.HasSuffix(o.GetName(), "-certs") {
				// The chart names the guard's own Secret and webhook configuration.
				name := "eg-exit-guard"
				if o.GetKind() == "Role" {
					name = "eg-exit-guard-webhook-tls"
				}
				want = nil
				for _, r := range certRules[o.GetKind()] {
					r.ResourceNames = []string{name}
					if o.GetKind() == "ClusterRole" {
						r.Resources = slices.DeleteFunc(slices.Clone(r.Resources), func(res string) bool { return !slices.Contains(m.kinds, res) })
					}
					want = append(want, r)
				}
			}
			if diff := cmp.Diff(want, convert[rbacv1.ClusterRole](t, o).Rules); diff != "" {
				t.Errorf("%s: %s %s rules differ from config/ (-generated +chart):\n%s", m.p.name, o.GetKind(), o.GetName(), diff)
			}
		}
	}
}

// TestChartCertificateIsValidForTheService checks the chart-generated certificate the way the
// API server will: it chains to the caBundle of the webhook configuration and names the Service.
func TestChartCertificateIsValidForTheService(t *testing.T) {
	objs := render(t, chartCerts, "eg", "argo")
	secret := convert[corev1.Secret](t, only(t, objs, "Secret"))
	vwc := convert[admissionregistrationv1.ValidatingWebhookConfiguration](t, only(t, objs, "ValidatingWebhookConfiguration"))
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(vwc.Webhooks[0].ClientConfig.CABundle) {
		t.Fatal("the caBundle holds no certificate")
	}
	block, _ := pem.Decode(secret.Data["tls.crt"])
	if block == nil {
		t.Fatal("tls.crt holds no certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	svc := vwc.Webhooks[0].ClientConfig.Service
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: svc.Name + "." + svc.Namespace + ".svc",
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("the serving certificate does not verify for the Service: %v", err)
	}
}

// TestChartRefusesTimingsThatDoNotFit: the live read's budget and a second must fit in the
// webhook's timeoutSeconds, one attempt in the budget, and the shutdown delay and graceful
// shutdown in the pod's grace period; a certificate must outlive its renewal lookahead (and
// the lookahead two checks); extraArgs may not override a flag the chart sets from a value
// (past these checks).
func TestChartRefusesTimingsThatDoNotFit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		set     []string
		wantErr string
	}{
		{name: "the defaults fit"},
		{name: "a budget a second short of the webhook timeout fits", set: []string{"guard.liveReadBudget=9000ms", "webhook.timeoutSeconds=10"}},
		{name: "a budget as long as the webhook timeout", set: []string{"guard.liveReadBudget=5s"}, wantErr: "does not fit in webhook.timeoutSeconds (5)"},
		{name: "a budget less than a second short of it", set: []string{"guard.liveReadBudget=4500ms"}, wantErr: "does not fit"},
		{name: "a shorter webhook timeout", set: []string{"webhook.timeoutSeconds=3"}, wantErr: "does not fit in webhook.timeoutSeconds (3)"},
		{name: "an attempt longer than the budget", set: []string{"guard.liveReadTimeout=2s", "guard.liveReadBudget=1500ms"}, wantErr: "is longer than guard.liveReadBudget"},
		{name: "a shutdown delay that leaves no time to stop", set: []string{"shutdownDelay=25s"}, wantErr: "do not fit in terminationGracePeriodSeconds (40)"},
		{name: "a longer grace period makes room for it", set: []string{"shutdownDelay=25s", "terminationGracePeriodSeconds=45"}},
		{name: "a graceful shutdown that leaves no time to stop", set: []string{"gracefulShutdownTimeout=31s"}, wantErr: "gracefulShutdownTimeout (31s) do not fit in terminationGracePeriodSeconds (40)"},
		{name: "a shorter graceful shutdown makes room for a longer delay", set: []string{"shutdownDelay=25s", "gracefulShutdownTimeout=15s"}},
		{name: "extraArgs with a flag the chart does not set", set: []string{"extraArgs={--kube-api-qps=50}"}},
		{name: "extraArgs overriding the live-read budget", set: []string{"extraArgs={--live-read-budget=9s}"}, wantErr: "extraArgs sets --live-read-budget, which the chart sets from its values"},
		{name: "extraArgs overriding a flag without its value", set: []string{"extraArgs={--webhook-port}"}, wantErr: "extraArgs sets --webhook-port"},
		{name: "extraArgs with one dash (the schema wants two)", set: []string{"extraArgs={-mode=warn}"}, wantErr: "don't meet the specifications of the schema"},
		{name: "a lookahead as long as the certificate", set: []string{"certificates.self.serverCertDuration=2160h"}, wantErr: "certificates.self.lookahead (2160h) is not shorter than certificates.self.serverCertDuration (2160h)"},
		{name: "a lookahead shorter than two checks", set: []string{"certificates.self.lookahead=20h"}, wantErr: "shorter than two checks"},
		{name: "a short certificate with a shorter lookahead and frequent checks", set: []string{"certificates.self.serverCertDuration=1h30m", "certificates.self.lookahead=30m", "certificates.self.checkFrequency=10m"}},
		{name: "cert-manager's CA living no longer than its serving certificate", set: []string{"certificates.mode=cert-manager",
			"certificates.certManager.caDuration=2160h"}, wantErr: "certificates.certManager.caDuration (2160h) is not longer than certificates.certManager.duration (2160h)"},
		{name: "cert-manager's CA left to an issuerRef", set: []string{"certificates.mode=cert-manager", "certificates.certManager.caDuration=1h",
			"certificates.certManager.issuerRef.name=corporate-ca"}},
		{name: "cert-manager renewing before it is issued", set: []string{"certificates.mode=cert-manager", "certificates.certManager.renewBefore=2160h"}, wantErr: "certificates.certManager.renewBefore (2160h) is not shorter than certificates.certManager.duration (2160h)"},
		// The sidecar shares the controller's pod: none of its ports may be one the argo-workflows
		// chart's controller uses (metrics 9090, telemetry 8081, health 6060).
		{name: "the sidecar's defaults take none of the controller's ports", set: []string{"installMode=sidecar"}},
		{name: "a sidecar probe port on the controller's telemetry port", set: []string{"installMode=sidecar", "sidecar.probePort=8081"}, wantErr: "sidecar.probePort (8081) is a port of Argo's controller pod"},
		{name: "a sidecar metrics port on the controller's metrics port", set: []string{"installMode=sidecar", "metrics.port=9090"}, wantErr: "metrics.port (9090) is a port of Argo's controller pod"},
		{name: "standalone, the probe port 8081 is the guard's own", set: []string{"probePort=8081"}},
		// A scrape the Prometheus Operator would skip, or the guard refuse, is refused here.
		{name: "secure metrics scraped from another namespace without a CA there", set: []string{"metrics.secure=true", "metrics.serviceMonitor.enabled=true",
			"metrics.serviceMonitor.namespace=monitoring"}, wantErr: "set metrics.serviceMonitor.tlsConfig to a CA found there"},
		{name: "token audiences with Prometheus's own token", set: []string{"metrics.secure=true", "metrics.serviceMonitor.enabled=true",
			"metrics.tokenAudiences={exit-guard}"}, wantErr: "the guard would refuse every scrape"},
		{name: "Prometheus's ServiceAccount without its namespace", set: []string{"metrics.secure=true", "metrics.serviceMonitor.enabled=true",
			"metrics.serviceMonitor.prometheusServiceAccount.name=prometheus"}, wantErr: "the namespace of Prometheus's ServiceAccount"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", "exit-guard", chartDir, "--namespace", "argo", "--kube-version", testenv.KubeVersion()}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := exec.Command(helm(t), args...).CombinedOutput() //nolint:gosec // G204: the pinned helm of this repository
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("helm template refused %v: %v\n%s", tc.set, err, out)
			case tc.wantErr != "" && err == nil:
				t.Errorf("helm template accepted %v, want it refused", tc.set)
			case tc.wantErr != "" && !strings.Contains(string(out), tc.wantErr):
				t.Errorf("helm template refused %v saying %s, want %q", tc.set, out, tc.wantErr)
			}
		})
	}
}

// TestGoMemoryLimitFollowsTheContainers: with a memory limit the guard's container gets it in
// bytes through the downward API (the guard holds its heap to 90% of it); without one, nothing.
func TestGoMemoryLimitFollowsTheContainers(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		want bool
	}{
		{name: "the default limit", want: true},
		{name: "no limit", set: []string{"resources.limits=null"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := convert[appsv1.Deployment](t, only(t, render(t, profile{name: tc.name, set: tc.set}, "eg", "argo"), "Deployment"))
			c := d.Spec.Template.Spec.Containers[0]
			var found *corev1.EnvVar
			for i := range c.Env {
				if c.Env[i].Name == "EXIT_GUARD_MEMORY_LIMIT" {
					found = &c.Env[i]
				}
			}
			switch {
			case tc.want && (found == nil || found.ValueFrom == nil || found.ValueFrom.ResourceFieldRef == nil ||
				found.ValueFrom.ResourceFieldRef.Resource != "limits.memory" || found.ValueFrom.ResourceFieldRef.ContainerName != c.Name):
				t.Errorf("EXIT_GUARD_MEMORY_LIMIT = %+v, want the container's limits.memory", found)
			case !tc.want && found != nil:
				t.Errorf("EXIT_GUARD_MEMORY_LIMIT set without a memory limit: %+v", found)
			}
		})
	}
}

// readExample decodes the file name of examples/ into v with unmarshal, failing t when it
// cannot.
func readExample(t *testing.T, name string, v any, unmarshal func([]byte, any) error) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := unmarshal(raw, v); err != nil {
		t.Fatalf("examples/%s: %v", name, err)
	}
}

// serviceAccountMay says whether the API server lets user, a ServiceAccount of namespace ns, do
// what attrs names (a SubjectAccessReview).
func serviceAccountMay(t *testing.T, user, ns string, attrs authorizationv1.ResourceAttributes) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &attrs}}
	if err := env.Client.Create(t.Context(), sar); err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}
