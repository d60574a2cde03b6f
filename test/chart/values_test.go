//go:build envtest

package chart

import (
	"context"
	"crypto/tls"
	"maps"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

func profileNamed(t *testing.T, name string) profile {
	t.Helper()
	for _, p := range profiles {
		if p.name == name {
			return p
		}
	}
	t.Fatalf("no profile %q", name)
	return profile{}
}

// TestTuningValuesLandWhereTheySay checks, in the profiles that set them, that the
// reachability and tuning values reach the objects the API server accepted
// (TestRenderedManifestsAreAcceptedByTheAPIServer).
func TestTuningValuesLandWhereTheySay(t *testing.T) {
	t.Run("host network", func(t *testing.T) {
		dep := convert[appsv1.Deployment](t, only(t, render(t, profileNamed(t, "host-network"), "eg", "argo"), "Deployment"))
		spec := dep.Spec.Template.Spec
		if !spec.HostNetwork || spec.DNSPolicy != "ClusterFirstWithHostNet" {
			t.Errorf("hostNetwork %v dnsPolicy %q, want true and ClusterFirstWithHostNet", spec.HostNetwork, spec.DNSPolicy)
		}
		if args := strings.Join(spec.Containers[0].Args, " "); !strings.Contains(args, "--webhook-port=9445") || !strings.Contains(args, "--metrics-bind-address=:9446") {
			t.Errorf("the ports chosen for the host are not the guard's: %s", args)
		}
	})
	t.Run("dns policy and a percentage budget", func(t *testing.T) {
		objs := render(t, profileNamed(t, "dns-policy-percentage-budget"), "eg", "argo")
		if dep := convert[appsv1.Deployment](t, only(t, objs, "Deployment")); dep.Spec.Template.Spec.DNSPolicy != "Default" || dep.Spec.Template.Spec.HostNetwork {
			t.Errorf("dnsPolicy %q hostNetwork %v, want Default and false", dep.Spec.Template.Spec.DNSPolicy, dep.Spec.Template.Spec.HostNetwork)
		}
		if pdb := convert[policyv1.PodDisruptionBudget](t, only(t, objs, "PodDisruptionBudget")); pdb.Spec.MinAvailable.String() != "50%" || pdb.Spec.MaxUnavailable != nil {
			t.Errorf("PDB %+v, want minAvailable 50%%", pdb.Spec)
		}
	})
	t.Run("coverage", func(t *testing.T) {
		coverage := []string{"not-a-lifecycle-hook-pod", "exit-handler-hook-or-agent-pod", "exit-handler-or-agent-pod"}
		for _, p := range []struct {
			profile   string
			args      []string
			condition string // the match condition of coverage, or none
		}{
			{"default", []string{"--cover=all", "--hook-step-read-budget=750ms"}, ""},
			{"exit-handlers-and-hooks", []string{"--cover=exit-handlers,hooks"}, "exit-handler-hook-or-agent-pod"},
			{"exit-handlers-and-steps", []string{"--cover=exit-handlers,steps"}, "not-a-lifecycle-hook-pod"},
			{"exit-handlers-only", []string{"--cover=exit-handlers"}, "exit-handler-or-agent-pod"},
		} {
			objs := render(t, profileNamed(t, p.profile), "eg", "argo")
			args := convert[appsv1.Deployment](t, only(t, objs, "Deployment")).Spec.Template.Spec.Containers[0].Args
			for _, a := range p.args {
				if !slices.Contains(args, a) {
					t.Errorf("%s: args lack %s: %v", p.profile, a, args)
				}
			}
			vwc := convert[admissionregistrationv1.ValidatingWebhookConfiguration](t, only(t, objs, "ValidatingWebhookConfiguration"))
			var got []string
			for _, mc := range vwc.Webhooks[0].MatchConditions {
				if slices.Contains(coverage, mc.Name) {
					got = append(got, mc.Name)
				}
			}
			if want := slices.DeleteFunc([]string{p.condition}, func(s string) bool { return s == "" }); !slices.Equal(got, want) {
				t.Errorf("%s: the pod webhook's coverage conditions are %v, want %v", p.profile, got, want)
			}
		}
	})
	t.Run("conventional values", func(t *testing.T) {
		objs := render(t, profileNamed(t, "conventional-values"), "eg", "argo")
		dep := convert[appsv1.Deployment](t, only(t, objs, "Deployment"))
		c := dep.Spec.Template.Spec.Containers[0]
		if c.Image != "mirror.example.com/exit-guard/exit-guard:"+chartVersion(t) {
			t.Errorf("global.image.registry: image %s", c.Image)
		}
		if *dep.Spec.RevisionHistoryLimit != 3 {
			t.Errorf("revisionHistoryLimit %d, want 3", *dep.Spec.RevisionHistoryLimit)
		}
		if v := dep.Spec.Template.Spec.Volumes; v[len(v)-1].Name != "scratch" || v[len(v)-1].EmptyDir == nil {
			t.Errorf("extraVolumes: %v", v)
		}
		if m := c.VolumeMounts; m[len(m)-1].Name != "scratch" || m[len(m)-1].MountPath != "/scratch" {
			t.Errorf("extraVolumeMounts: %v", m)
		}
		if c.LivenessProbe.PeriodSeconds != 20 || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe.FailureThreshold != 6 || c.ReadinessProbe.PeriodSeconds != 5 {
			t.Errorf("probe overrides: liveness %+v readiness %+v", c.LivenessProbe, c.ReadinessProbe)
		}
		if svc := only(t, objs, "Service"); svc.GetAnnotations()["team"] != "platform" {
			t.Errorf("service.annotations: %v", svc.GetAnnotations())
		}
		extra := false
		for _, o := range find(objs, "ConfigMap") {
			extra = extra || o.GetName() == "eg-extra"
		}
		if !extra {
			t.Error("extraObjects: no ConfigMap eg-extra (its name through tpl)")
		}
		pod := convert[corev1.Pod](t, onlyTestHook(t, objs, "Pod"))
		if pod.Spec.NodeSelector["pool"] != "system" || len(pod.Spec.Tolerations) != 1 || !slices.Contains(pod.Spec.Containers[0].Args, "--timeout=3m") || pod.Spec.Containers[0].Image != c.Image {
			t.Errorf("the test pod's scheduling, timeout or image: %+v", pod.Spec)
		}
		if sm := only(t, objs, "ServiceMonitor"); sm.GetNamespace() != "monitoring" {
			t.Errorf("serviceMonitor.namespace: %s", sm.GetNamespace())
		} else if names, _, _ := unstructured.NestedStringSlice(sm.Object, "spec", "namespaceSelector", "matchNames"); !slices.Equal(names, []string{"argo"}) {
			t.Errorf("a ServiceMonitor in another namespace must select the release's: %v", names)
		}
		spec := only(t, objs, "PrometheusRule").Object["spec"]
		if names := alertNames(t, spec); slices.Contains(names, "ExitGuardAPIServerMetricsMissing") || !slices.Contains(names, "ExitGuardNoReadyReplica") {
			t.Errorf("prometheusRule.disabled: alerts %v", names)
		}
		// An image that names its registry keeps it (the values of a release before
		// image.registry), and a name that is not an alert is refused.
		old := render(t, profile{name: "mirror", set: []string{"image.repository=registry.example.com:5000/platform/exit-guard"}}, "eg", "argo")
		if img := convert[appsv1.Deployment](t, only(t, old, "Deployment")).Spec.Template.Spec.Containers[0].Image; img != "registry.example.com:5000/platform/exit-guard:"+chartVersion(t) {
			t.Errorf("image.repository naming a registry: %s", img)
		}
		// A name no alert has, and a name no released chart ever gave an alert (the refusal
		// alert's name before the first release), are refused: accepted, they would turn nothing off.
		for _, name := range []string{"ExitGuardNoSuchAlert", "ExitGuardDeniedExitHandler"} {
			args := append([]string{"template", "eg", chartDir, "--namespace", "argo", "--kube-version", testenv.KubeVersion()},
				"--set", "prometheusRule.enabled=true", "--set", "prometheusRule.disabled."+name+"=true")
			if out, err := exec.CommandContext(t.Context(), helm(t), args...).CombinedOutput(); err == nil || !strings.Contains(string(out), name+", which is not an alert") { //nolint:gosec // G204: the pinned helm of this repository
				t.Errorf("prometheusRule.disabled.%s rendered, or without saying so: %v\n%s", name, err, out)
			}
		}
	})
	t.Run("secure metrics, Prometheus's own token", func(t *testing.T) {
		objs := render(t, profileNamed(t, "secure-metrics-prometheus-token"), "eg", "argo")
		ep, _, _ := unstructured.NestedSlice(only(t, objs, "ServiceMonitor").Object, "spec", "endpoints")
		e := ep[0].(map[string]any)
		// The scrape shows the token the kubelet projects into Prometheus's pod and renews: no
		// Secret holds a token that never expires.
		if e["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" || e["authorization"] != nil {
			t.Errorf("the scrape's token: %v, want Prometheus's own ServiceAccount token file", e)
		}
		bound := false
		for _, o := range find(objs, "ClusterRoleBinding") {
			if o.GetName() == "eg-exit-guard-prometheus" {
				crb := convert[rbacv1.ClusterRoleBinding](t, o)
				bound = crb.RoleRef.Name == "eg-exit-guard-metrics-reader" && len(crb.Subjects) == 1 &&
					crb.Subjects[0].Name == "prometheus" && crb.Subjects[0].Namespace == "monitoring"
			}
		}
		if !bound {
			t.Error("Prometheus's ServiceAccount is not bound to the metrics reader")
		}
	})
	t.Run("no profile renders a token that never expires", func(t *testing.T) {
		for _, p := range profiles {
			for _, o := range find(render(t, p, "eg", "argo"), "Secret") {
				if o.Object["type"] == "kubernetes.io/service-account-token" {
					t.Errorf("profile %s renders the ServiceAccount token Secret %s", p.name, o.GetName())
				}
			}
		}
	})
	t.Run("cert-manager: the chart's own CA", func(t *testing.T) {
		// A self-signed Issuer signs only the CA's Certificate; a CA Issuer on that
		// Certificate's Secret signs the serving one (make e2e-certmanager renews it for real).
		objs := render(t, profileNamed(t, "cert-manager"), "eg", "argo")
		byName := map[string]*unstructured.Unstructured{}
		for _, kind := range []string{"Issuer", "Certificate"} {
			for _, o := range find(objs, kind) {
				byName[kind+"/"+o.GetName()] = o
			}
		}
		str := func(o *unstructured.Unstructured, path ...string) string {
			if o == nil {
				return ""
			}
			s, _, _ := unstructured.NestedString(o.Object, path...)
			return s
		}
		self, ca, caIssuer, serving := byName["Issuer/eg-exit-guard-selfsigned"], byName["Certificate/eg-exit-guard-ca"],
			byName["Issuer/eg-exit-guard-ca"], byName["Certificate/eg-exit-guard-webhook"]
		if self == nil || ca == nil || caIssuer == nil || serving == nil || len(byName) != 4 {
			t.Fatalf("cert-manager mode renders %v, want the self-signed Issuer, the CA Certificate, the CA Issuer and the serving Certificate", slices.Sorted(maps.Keys(byName)))
		}
		if _, ok, _ := unstructured.NestedMap(self.Object, "spec", "selfSigned"); !ok {
			t.Error("the first Issuer is not self-signed")
		}
		if isCA, _, _ := unstructured.NestedBool(ca.Object, "spec", "isCA"); !isCA || str(ca, "spec", "issuerRef", "name") != self.GetName() {
			t.Errorf("the CA Certificate: isCA %v, issued by %q; want a CA issued by the self-signed Issuer", isCA, str(ca, "spec", "issuerRef", "name"))
		}
		if str(caIssuer, "spec", "ca", "secretName") != str(ca, "spec", "secretName") || str(ca, "spec", "secretName") == "" {
			t.Errorf("the CA Issuer signs with Secret %q, the CA Certificate is in %q", str(caIssuer, "spec", "ca", "secretName"), str(ca, "spec", "secretName"))
		}
		if str(serving, "spec", "issuerRef", "name") != caIssuer.GetName() || str(serving, "spec", "issuerRef", "kind") != "Issuer" {
			t.Errorf("the serving Certificate is issued by %q, want the CA Issuer", str(serving, "spec", "issuerRef", "name"))
		}
		// With an issuerRef of the user's, the chart makes no CA of its own.
		objs = render(t, profileNamed(t, "cert-manager-with-issuer"), "eg", "argo")
		if n := len(find(objs, "Issuer")) + len(find(objs, "Certificate")); n != 1 || str(only(t, objs, "Certificate"), "spec", "issuerRef", "name") != "corporate-ca" {
			t.Errorf("with issuerRef: %d Issuers and Certificates, want the serving Certificate alone, issued by corporate-ca", n)
		}
	})
	t.Run("openshift", func(t *testing.T) {
		sc := convert[appsv1.Deployment](t, only(t, render(t, profileNamed(t, "openshift"), "eg", "argo"), "Deployment")).Spec.Template.Spec.SecurityContext
		if sc.RunAsUser != nil || sc.RunAsGroup != nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("podSecurityContext %+v, want no fixed user or group and runAsNonRoot", sc)
		}
	})
	t.Run("namespaced", func(t *testing.T) {
		objs := render(t, profileNamed(t, "namespaced"), "eg", "argo")
		for _, o := range find(objs, "ClusterRole") {
			if o.GetName() != "eg-exit-guard" {
				continue
			}
			if rules := convert[rbacv1.ClusterRole](t, o).Rules; len(rules) != 0 {
				t.Errorf("a namespaced install grants cluster-wide: %v", rules)
			}
		}
		var roles []string
		for _, o := range find(objs, "Role") {
			if o.GetName() == "eg-exit-guard" {
				roles = append(roles, o.GetNamespace())
			}
		}
		if !slices.Equal(roles, []string{"argo", "ci"}) {
			t.Errorf("Roles of the guard in %v, want argo and ci", roles)
		}
		vwc := convert[admissionregistrationv1.ValidatingWebhookConfiguration](t, only(t, objs, "ValidatingWebhookConfiguration"))
		for _, w := range vwc.Webhooks {
			last := w.NamespaceSelector.MatchExpressions[len(w.NamespaceSelector.MatchExpressions)-1]
			if last.Key != "kubernetes.io/metadata.name" || last.Operator != "In" || !slices.Equal(last.Values, []string{"argo", "ci"}) {
				t.Errorf("webhook %s is not scoped to the guarded namespaces: %+v", w.Name, w.NamespaceSelector)
			}
		}
	})
	t.Run("everything", func(t *testing.T) {
		objs := render(t, profileNamed(t, "everything"), "eg", "argo")
		c := convert[appsv1.Deployment](t, only(t, objs, "Deployment")).Spec.Template.Spec.Containers[0]
		for _, want := range []string{"--metrics-secure", "--pprof-bind-address=127.0.0.1:8082"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("args lack %s: %v", want, c.Args)
			}
		}
		if c.Args[len(c.Args)-1] != "--zap-stacktrace-level=panic" {
			t.Errorf("extraArgs do not come last (where they win): %v", c.Args)
		}
		if e := c.Env[len(c.Env)-1]; e.Name != "GOMEMLIMIT" || e.Value != "200MiB" {
			t.Errorf("extraEnv missing: %v", c.Env)
		}
		pdb := convert[policyv1.PodDisruptionBudget](t, only(t, objs, "PodDisruptionBudget"))
		if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.UnhealthyPodEvictionPolicy == nil || *pdb.Spec.UnhealthyPodEvictionPolicy != policyv1.AlwaysAllow {
			t.Errorf("PDB %+v, want maxUnavailable 1 alone and AlwaysAllow", pdb.Spec)
		}
		sm := only(t, objs, "ServiceMonitor")
		ep, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		e := ep[0].(map[string]any)
		if e["scheme"] != "https" || e["scrapeTimeout"] != "10s" || e["honorLabels"] != true || e["relabelings"] == nil || e["metricRelabelings"] == nil || e["bearerTokenFile"] != nil {
			t.Errorf("ServiceMonitor endpoint %v lacks the values, or has the deprecated bearerTokenFile", e)
		}
		if cred, _, _ := unstructured.NestedString(e, "authorization", "credentials", "name"); cred != "prometheus-exit-guard-token" {
			t.Errorf("ServiceMonitor authorization names the Secret %q, want the one of metrics.serviceMonitor.authorization", cred)
		}
		serverName, _, _ := unstructured.NestedString(e, "tlsConfig", "serverName")
		caSecret, _, _ := unstructured.NestedString(e, "tlsConfig", "ca", "secret", "name")
		caKey, _, _ := unstructured.NestedString(e, "tlsConfig", "ca", "secret", "key")
		if skip, _, _ := unstructured.NestedBool(e, "tlsConfig", "insecureSkipVerify"); skip || serverName != "eg-exit-guard-webhook.argo.svc" ||
			caSecret != "eg-exit-guard-webhook-tls" || caKey != "ca.crt" {
			t.Errorf("ServiceMonitor tlsConfig %v: want the certificate verified with the Secret's ca.crt under the webhook Service's name", e["tlsConfig"])
		}
		if sm.GetAnnotations()["note"] != "guard" {
			t.Errorf("ServiceMonitor annotations %v", sm.GetAnnotations())
		}
		var reader bool
		for _, o := range find(objs, "ClusterRole") {
			reader = reader || strings.HasSuffix(o.GetName(), "-metrics-reader")
		}
		if !reader {
			t.Errorf("metrics.secure renders no metrics-reader ClusterRole to bind to Prometheus")
		}
	})
	t.Run("client certificates, the API server's addresses, the expected requester", func(t *testing.T) {
		objs := render(t, profileNamed(t, "client-auth"), "eg", "argo")
		spec := convert[appsv1.Deployment](t, only(t, objs, "Deployment")).Spec.Template.Spec
		c := spec.Containers[0]
		for _, want := range []string{"--webhook-client-ca-file=/etc/exit-guard/client-ca/client-ca.pem",
			"--expected-requester=system:serviceaccount:workflows:controller", "--max-concurrent-decisions=64",
			"--live-read-get-after=-1ms", "--taskset-repeats-for=3s", "--sweep-interval=1m"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("args lack %s: %v", want, c.Args)
			}
		}
		mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "exit-guard-client-ca" && m.MountPath == "/etc/exit-guard/client-ca"
		})
		volume := slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
			return v.Name == "exit-guard-client-ca" && v.ConfigMap != nil && v.ConfigMap.Name == "apiserver-client-ca"
		})
		if !mounted || !volume {
			t.Errorf("the client CA ConfigMap is not mounted where the flag points: mounts %v, volumes %v", c.VolumeMounts, spec.Volumes)
		}
		np := convert[networkingv1.NetworkPolicy](t, only(t, objs, "NetworkPolicy"))
		var webhookFrom []networkingv1.NetworkPolicyPeer
		for _, r := range np.Spec.Ingress {
			if len(r.Ports) == 1 && r.Ports[0].Port.IntValue() == 9443 {
				webhookFrom = r.From
			}
		}
		if len(webhookFrom) != 1 || webhookFrom[0].IPBlock == nil || webhookFrom[0].IPBlock.CIDR != "10.0.0.10/32" {
			t.Errorf("the webhook port is open to %v, want the API server's address alone", webhookFrom)
		}
		for _, tc := range []struct{ set, want string }{
			// Off until set: a guessed name files every real refusal as an unexpected
			// requester's when Argo runs under another.
			{"", "--expected-requester="},
			{"sidecar.controllerServiceAccount=wfc", "--expected-requester="},
			{"guard.expectedRequester=system:serviceaccount:argo:argo", "--expected-requester=system:serviceaccount:argo:argo"},
		} {
			p := profile{name: "requester"}
			if tc.set != "" {
				p.set = []string{tc.set}
			}
			args := convert[appsv1.Deployment](t, only(t, render(t, p, "eg", "argo"), "Deployment")).Spec.Template.Spec.Containers[0].Args
			if !slices.Contains(args, tc.want) {
				t.Errorf("with %q the args lack %s: %v", tc.set, tc.want, args)
			}
		}
	})
	t.Run("sidecar network policy keeps the controller's ports open", func(t *testing.T) {
		objs := render(t, profileNamed(t, "sidecar-network-policy"), "eg", "argo")
		np := convert[networkingv1.NetworkPolicy](t, only(t, objs, "NetworkPolicy"))
		if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"] != "workflow-controller" {
			t.Errorf("the policy selects %v, want the controller's pod", np.Spec.PodSelector)
		}
		open := map[int]bool{}
		for _, r := range np.Spec.Ingress {
			for _, p := range r.Ports {
				open[p.Port.IntValue()] = true
			}
		}
		for _, port := range []int{9443, 8080, 9090, 8081, 6060} {
			if !open[port] {
				t.Errorf("port %d is closed by the policy on the controller's pod: %v", port, np.Spec.Ingress)
			}
		}
	})
}

// TestTuningValuesWork runs the guard with the arguments the chart renders for pprof,
// authenticated metrics and extraArgs, and checks each does what it says: the profiling
// endpoint answers, metrics refuse a client without credentials, an extra argument (a flag the
// chart does not set: one it sets is refused, TestChartRefusesTimingsThatDoNotFit) takes effect.
func TestTuningValuesWork(t *testing.T) {
	ns := newNamespace(t, nil)
	pprofAddr, err := testenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p := profile{name: "tuning", set: append([]string{"metrics.secure=true", "pprof.enabled=true", "pprof.bindAddress=" + pprofAddr,
		"extraArgs={--zap-time-encoding=epoch}"}, chartCerts.set...)}
	objs := render(t, p, "tune", ns)
	install(t, objs)
	g, out := startChartGuard(t, ns, objs)

	get := func(url string) (int, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // G402: the guard's self-signed metrics certificate
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	// The metrics and pprof servers start beside the webhook, and may not listen yet when the
	// guard is ready.
	poll := func(url string) (code int, err error) {
		_ = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			code, err = get(url)
			return err == nil, nil
		})
		return code, err
	}
	if code, err := poll("http://" + pprofAddr + "/debug/pprof/"); err != nil || code != http.StatusOK {
		t.Errorf("pprof: %d, %v; want 200", code, err)
	}
	if code, err := poll("https://" + g.MetricsAddr + "/metrics"); err != nil || code != http.StatusUnauthorized {
		t.Errorf("metrics without credentials: %d, %v; want 401", code, err)
	}
	if first, _, _ := strings.Cut(out.String(), "\n"); !strings.HasPrefix(first, `{"level":"info","ts":1`) {
		t.Errorf("extraArgs --zap-time-encoding=epoch did not take effect (a number for ts): %s", first)
	}
}
