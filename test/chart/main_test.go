//go:build envtest

// Package chart tests the Helm chart against a real API server: every values profile lints,
// renders and is accepted by the API server; the guard does its whole job with exactly the
// chart's permissions, called by the API server through the chart's own webhook
// configuration; certificates rotate under load and survive upgrades.
package chart

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var (
	env *testenv.Env
	// extraCRDDirs are read after testdata/crds, whose stand-ins they replace (the last CRD of
	// a name wins): the real cert-manager's, with the certmanager tag.
	extraCRDDirs []string
	guardBin     string
	chartDir     = filepath.Join(testenv.RepoRoot(), "charts", "exit-guard")
)

func TestMain(m *testing.M) {
	// The test clients log the API server's warnings (warn mode's) through controller-runtime.
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	dir, err := os.MkdirTemp("", "exit-guard-chart-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	guardBin, err = testenv.BuildGuard(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	// Aggregator routing: the API server calls a webhook's Service at an endpoint of its
	// EndpointSlice (no kube-proxy routes a cluster IP here), as the Argo CD proof needs.
	code := testenv.Main(m, testenv.Options{CRDDirs: append([]string{filepath.Join("testdata", "crds")}, extraCRDDirs...),
		APIServerFlags: map[string]string{"enable-aggregator-routing": "true"}}, &env)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// helm returns the helm binary: $HELM, or the one make builds into ./bin.
func helm(t *testing.T) string {
	t.Helper()
	bin, err := testenv.HelmBin()
	if err != nil {
		t.Fatalf("the chart tests need helm: %v", err)
	}
	return bin
}

// runHelm runs helm and returns its standard output.
func runHelm(t *testing.T, args ...string) []byte {
	t.Helper()
	return runHelmBin(t, helm(t), args...)
}

// runHelmBin runs the helm binary bin and returns its standard output.
func runHelmBin(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(bin, args...) //nolint:gosec // G204: a pinned helm of this repository
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

// profile is a set of values the chart is tested with.
type profile struct {
	name string
	set  []string
	// setJSON are --set-json values (those --set cannot write, such as a template in a string).
	setJSON []string
	// podSecurity is the Pod Security level the guard's pods need; empty means restricted.
	podSecurity string
}

var profiles = []profile{
	{name: "default"},
	chartCerts,
	{name: "cert-manager", set: []string{"certificates.mode=cert-manager"}},
	{name: "cert-manager-with-issuer", set: []string{"certificates.mode=cert-manager",
		"certificates.certManager.issuerRef.name=corporate-ca", "certificates.certManager.issuerRef.kind=ClusterIssuer",
		"certificates.certManager.issuerRef.group=cert-manager.io"}},
	{name: "self-managed-warn", set: []string{"certificates.mode=self", "guard.mode=warn"}},
	{name: "dry-run", set: []string{"guard.mode=dry-run"}},
	{name: "warn-without-tasksets", set: []string{"guard.mode=warn", "webhook.taskSets.enabled=false", "webhook.events.enabled=false"}},
	{name: "without-events", set: []string{"webhook.events.enabled=false"}},
	{name: "exit-handlers-and-hooks", set: []string{`guard.cover=exit-handlers\,hooks`}},
	{name: "exit-handlers-and-steps", set: []string{`guard.cover=exit-handlers\,steps`}},
	{name: "exit-handlers-only", set: []string{"guard.cover=exit-handlers"}},
	// The kill switch: no webhook configuration, the guard running.
	{name: "webhooks-off", set: []string{"webhook.enabled=false", "prometheusRule.enabled=true"}},
	{name: "fail-closed", set: []string{"webhook.failurePolicy=Fail", "webhook.timeoutSeconds=3", "guard.liveReadBudget=2s"}},
	{name: "sidecar", set: []string{"installMode=sidecar"}},
	{name: "sidecar-chart-certificates", set: []string{"installMode=sidecar", "certificates.mode=chart"}},
	{name: "sidecar-network-policy", set: []string{"installMode=sidecar", "networkPolicy.enabled=true", "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus"}},
	// hostNetwork is not allowed by the restricted or baseline Pod Security profiles.
	{name: "host-network", podSecurity: "privileged", set: []string{"hostNetwork=true", "webhook.port=9445", "metrics.port=9446", "probePort=9447"}},
	{name: "client-auth", set: []string{"webhook.clientAuth.caConfigMap=apiserver-client-ca", "webhook.clientAuth.caKey=client-ca.pem",
		"networkPolicy.enabled=true", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.10/32",
		"guard.expectedRequester=system:serviceaccount:workflows:controller", "guard.maxConcurrentDecisions=64",
		"guard.liveReadGetAfter=-1ms", "guard.taskSetRepeatsFor=3s", "guard.sweepInterval=1m"}},
	// The conventional values of charts like argo-helm's, Kyverno's and cert-manager's.
	{name: "conventional-values", set: []string{
		"global.image.registry=mirror.example.com", "revisionHistoryLimit=3", "service.annotations.team=platform",
		`extraVolumes[0].name=scratch`, `extraVolumes[0].emptyDir.medium=Memory`,
		`extraVolumeMounts[0].name=scratch`, `extraVolumeMounts[0].mountPath=/scratch`,
		"livenessProbe.periodSeconds=20", "readinessProbe.failureThreshold=6",
		`check.nodeSelector.pool=system`, "check.tolerations[0].key=dedicated", "check.tolerations[0].operator=Exists",
		"prometheusRule.enabled=true", "prometheusRule.disabled.ExitGuardAPIServerMetricsMissing=true",
		"metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.namespace=monitoring",
	}, setJSON: []string{`extraObjects=[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{ .Release.Name }}-extra","namespace":"{{ .Release.Namespace }}"}}]`}},
	// A namespaced install: the webhook and the Workflow and Event rights scoped to the
	// namespaces guarded.
	{name: "namespaced", set: []string{"certificates.mode=chart", "guard.namespaces={argo,ci}"}},
	// HTTPS metrics scraped with Prometheus's own ServiceAccount token, bound to the reader.
	{name: "secure-metrics-prometheus-token", set: []string{"metrics.secure=true", "metrics.serviceMonitor.enabled=true",
		"metrics.serviceMonitor.prometheusServiceAccount.name=prometheus", "metrics.serviceMonitor.prometheusServiceAccount.namespace=monitoring"}},
	// OpenShift's restricted-v2 SCC chooses the user (docs/platforms.md).
	{name: "openshift", set: []string{"podSecurityContext.runAsUser=null", "podSecurityContext.runAsGroup=null"}},
	{name: "dns-policy-percentage-budget", set: []string{"dnsPolicy=Default", "podDisruptionBudget.minAvailable=50%"}},
	{name: "everything", set: []string{
		"image.digest=sha256:" + strings.Repeat("ab", 32),
		"commonLabels.team=platform", "commonAnnotations.owner=platform-team",
		"podLabels.tier=admission", "podAnnotations.note=guard",
		"priorityClassName=system-cluster-critical",
		`nodeSelector.kubernetes\.io/os=linux`,
		"tolerations[0].key=dedicated", "tolerations[0].operator=Exists", "tolerations[0].effect=NoSchedule",
		"metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prometheus",
		"dashboard.enabled=true", "dashboard.annotations.grafana_folder=Argo",
		"prometheusRule.enabled=true", "prometheusRule.labels.release=prometheus", "prometheusRule.alertLabels.team=platform",
		"metrics.secure=true", "metrics.tokenAudiences={exit-guard}", "metrics.serviceMonitor.scrapeTimeout=10s", "metrics.serviceMonitor.honorLabels=true",
		"metrics.serviceMonitor.authorization.type=Bearer", "metrics.serviceMonitor.authorization.credentials.name=prometheus-exit-guard-token",
		"metrics.serviceMonitor.authorization.credentials.key=token",
		"metrics.serviceMonitor.annotations.note=guard",
		"metrics.serviceMonitor.relabelings[0].targetLabel=cluster", "metrics.serviceMonitor.relabelings[0].replacement=prod",
		"metrics.serviceMonitor.metricRelabelings[0].sourceLabels={__name__}",
		"metrics.serviceMonitor.metricRelabelings[0].regex=go_gc_.*", "metrics.serviceMonitor.metricRelabelings[0].action=drop",
		"extraArgs={--zap-stacktrace-level=panic}", "extraEnv[0].name=GOMEMLIMIT", "extraEnv[0].value=200MiB",
		"pprof.enabled=true",
		"podDisruptionBudget.maxUnavailable=1", "podDisruptionBudget.unhealthyPodEvictionPolicy=AlwaysAllow",
		"networkPolicy.enabled=true",
		`guard.cover=exit-handlers\,hooks`, "guard.hookStepReadBudget=500ms", "guard.denyPhases={Succeeded,Failed,Error}", "guard.namespaces={argo,ci}",
		"logging.level=debug", "logging.format=console", "replicaCount=3",
		"webhook.extraMatchConditions[0].name=not-a-canary",
		"webhook.extraMatchConditions[0].expression=!has(object.metadata.labels) || !('canary' in object.metadata.labels)",
		"webhook.taskSets.failurePolicy=Fail",
		"webhook.taskSets.extraMatchConditions[0].name=not-a-canary",
		"webhook.taskSets.extraMatchConditions[0].expression=!has(object.metadata.labels) || !('canary' in object.metadata.labels)",
	}},
}

// chartCerts has Helm generate the webhook certificate (certificates.mode=chart): the tests
// that serve the API server's calls with envtest's own certificate use it.
var chartCerts = profile{name: "chart-certificates", set: []string{"certificates.mode=chart"}}

func (p profile) args() []string {
	var out []string
	for _, s := range p.set {
		out = append(out, "--set", s)
	}
	for _, s := range p.setJSON {
		out = append(out, "--set-json", s)
	}
	return out
}

// render runs helm template for p in namespace and returns the objects.
func render(t *testing.T, p profile, release, namespace string, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"template", release, chartDir, "--namespace", namespace, "--kube-version", testenv.KubeVersion()}, p.args()...)
	out := runHelm(t, append(args, extra...)...)
	return decodeAll(t, out)
}

func decodeAll(t *testing.T, manifests []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if err.Error() == "EOF" {
				return objs
			}
			t.Fatalf("decoding rendered manifests: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// find returns the rendered objects of kind that are installed with the release, not the
// hooks (`helm test`'s, check.afterSync's).
func find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if _, hook := o.GetAnnotations()["helm.sh/hook"]; o.GetKind() == kind && !hook {
			out = append(out, o)
		}
	}
	return out
}

// onlyTestHook returns the one object of kind that `helm test` creates.
func onlyTestHook(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && isTestHook(o) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("rendered %d %s for helm test, want 1", len(found), kind)
	}
	return found[0]
}

func isTestHook(o *unstructured.Unstructured) bool {
	return o.GetAnnotations()["helm.sh/hook"] == "test"
}

func only(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	found := find(objs, kind)
	if len(found) != 1 {
		t.Fatalf("rendered %d %s, want 1", len(found), kind)
	}
	return found[0]
}
