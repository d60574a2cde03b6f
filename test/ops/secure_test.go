//go:build e2e

package ops

import (
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// serviceMonitorEndpoint is the part of the chart's ServiceMonitor endpoint that the Prometheus
// Operator turns into a scrape job's TLS and authorization.
type serviceMonitorEndpoint struct {
	Scheme          string `json:"scheme"`
	BearerTokenFile string `json:"bearerTokenFile"`
	Authorization   struct {
		Type        string `json:"type"`
		Credentials struct {
			Name string `json:"name"`
			Key  string `json:"key"`
		} `json:"credentials"`
	} `json:"authorization"`
	TLSConfig struct {
		ServerName string `json:"serverName"`
		CA         struct {
			Secret struct {
				Name string `json:"name"`
				Key  string `json:"key"`
			} `json:"secret"`
		} `json:"ca"`
	} `json:"tlsConfig"`
}

// TestSecureMetricsOnTheRealPrometheus: with metrics.secure the real Prometheus scrapes the
// guard as the chart's ServiceMonitor says (HTTPS verified with the CA of the certificate's
// Secret under the webhook Service's name, Prometheus's own ServiceAccount token, a short-lived
// one from a file, bound by the chart to its metrics-reader ClusterRole), and an alert raised
// from those series is delivered. Two jobs
// beside it must fail: a token without the role, and the right token with another server name.
func TestSecureMetricsOnTheRealPrometheus(t *testing.T) {
	raw, err := runTool(helmBin, "template", "exit-guard", filepath.Join(testenv.RepoRoot(), "charts", "exit-guard"), "--namespace", namespace,
		"--kube-version", testenv.KubeVersion(), "--set", "metrics.secure=true", "--set", "metrics.serviceMonitor.enabled=true",
		"--set", "metrics.serviceMonitor.prometheusServiceAccount.name=prometheus",
		"--set", "metrics.serviceMonitor.prometheusServiceAccount.namespace="+namespace,
		"--show-only", "templates/servicemonitor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The template renders the binding of Prometheus's ServiceAccount before the ServiceMonitor.
	var binding *rbacv1.ClusterRoleBinding
	var sm struct {
		Kind string `json:"kind"`
		Spec struct {
			Endpoints []serviceMonitorEndpoint `json:"endpoints"`
		} `json:"spec"`
	}
	for _, doc := range strings.Split(string(raw), "\n---") {
		var d struct {
			Kind string `json:"kind"`
		}
		if yaml.Unmarshal([]byte(doc), &d) == nil && d.Kind == "ServiceMonitor" {
			if err := yaml.Unmarshal([]byte(doc), &sm); err != nil {
				t.Fatal(err)
			}
		}
		if d.Kind == "ClusterRoleBinding" {
			binding = &rbacv1.ClusterRoleBinding{}
			if err := yaml.Unmarshal([]byte(doc), binding); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("the ServiceMonitor: %d endpoints\n%s", len(sm.Spec.Endpoints), raw)
	}
	ep := sm.Spec.Endpoints[0]
	// The Prometheus Operator points the scrape at the token file bearerTokenFile names, the
	// token the kubelet projects into Prometheus's pod; a token requested for Prometheus's
	// ServiceAccount, short-lived as the kubelet's, stands in for it below.
	if ep.Scheme != "https" || ep.BearerTokenFile != "/var/run/secrets/kubernetes.io/serviceaccount/token" || ep.Authorization.Type != "" ||
		ep.TLSConfig.ServerName == "" || ep.TLSConfig.CA.Secret.Name == "" {
		t.Fatalf("the ServiceMonitor's endpoint with metrics.secure: %+v", ep)
	}
	if binding == nil {
		t.Fatalf("the chart renders no binding of Prometheus's ServiceAccount\n%s", raw)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	// The guard's certificate, for the webhook Service's name, and its CA in the Secret the
	// ServiceMonitor names (as the guard writes it in self mode).
	ca := testenv.NewCA(t, "exit-guard CA")
	crt, key := ca.Issue(t, ep.TLSConfig.ServerName, x509.ExtKeyUsageServerAuth, []string{ep.TLSConfig.ServerName}, []net.IP{net.IPv4(127, 0, 0, 1)})
	certDir := t.TempDir()
	write(t, filepath.Join(certDir, "tls.crt"), string(crt))
	write(t, filepath.Join(certDir, "tls.key"), string(key))
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: ep.TLSConfig.CA.Secret.Name},
		Data: map[string][]byte{ep.TLSConfig.CA.Secret.Key: ca.PEM, "tls.crt": crt, "tls.key": key}}
	if _, err := cs.CoreV1().Secrets(namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Secrets(namespace).Delete(ctx, secret.Name, metav1.DeleteOptions{}) })

	// Prometheus's ServiceAccount bound to the chart's ClusterRole, and one without it.
	rbac, err := runTool(helmBin, "template", "exit-guard", filepath.Join(testenv.RepoRoot(), "charts", "exit-guard"), "--namespace", namespace,
		"--kube-version", testenv.KubeVersion(), "--set", "metrics.secure=true", "--show-only", "templates/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var reader *rbacv1.ClusterRole
	for _, doc := range strings.Split(string(rbac), "\n---") {
		var cr rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &cr); err == nil && cr.Kind == "ClusterRole" && strings.HasSuffix(cr.Name, "-metrics-reader") {
			reader = &cr
		}
	}
	if reader == nil {
		t.Fatal("the chart renders no metrics-reader ClusterRole with metrics.secure")
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, reader, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	token := func(sa string) string {
		if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		hour := int64(3600)
		tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), sa+".token")
		write(t, path, tr.Status.Token)
		return path
	}
	allowed, other := token("prometheus"), token("somebody")

	// What the Operator writes from the endpoint: the CA read from the Secret, the token file
	// (the pod's own, here the file of the bound ServiceAccount's token).
	live, err := cs.CoreV1().Secrets(namespace).Get(ctx, ep.TLSConfig.CA.Secret.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	write(t, caFile, string(live.Data[ep.TLSConfig.CA.Secret.Key]))
	tls := func(tokenFile, serverName string) string {
		return fmt.Sprintf("    scheme: %s\n    authorization:\n      credentials_file: %s\n    tls_config:\n      ca_file: %s\n      server_name: %s\n",
			ep.Scheme, tokenFile, caFile, serverName)
	}
	// The guard's job, and two beside it that must fail.
	st := startStackScraping(t, true, func(service string) string {
		jobs := tls(allowed, ep.TLSConfig.ServerName)
		for _, j := range []struct{ name, token, server string }{{"no-role", other, ep.TLSConfig.ServerName}, {"wrong-name", allowed, "somewhere-else.argo.svc"}} {
			jobs += fmt.Sprintf("  - job_name: %s\n    static_configs:\n      - targets: [%q]\n", j.name, service) + tls(j.token, j.server)
		}
		return jobs
	})

	port := testenv.TestPort(t)
	st.guard(t, "--metrics-secure", "--webhook-cert-path="+certDir, "--webhook-port="+strconv.Itoa(port),
		"--lock-check-interval=1s", "--lock-stuck-after=1s")
	waitQuery(t, st, `up{job="exit-guard-metrics"} == 1`)
	waitQuery(t, st, `exit_guard_ready{namespace="argo",pod="exit-guard-a"} == 1`)
	for _, j := range []string{"no-role", "wrong-name"} {
		waitQuery(t, st, `up{job="`+j+`"} == 0`)
	}
	if got, err := testenv.Query(ctx, st.prom.Addr, `up{job=~"no-role|wrong-name"} == 1`); err != nil || len(got) != 0 {
		t.Fatalf("a scrape without the role or under another name succeeded: %v %v", got, err)
	}

	// An alert from the securely scraped series, delivered.
	ns := newNamespace(t)
	lock := ns + "/Mutex/secure"
	_, cause := waitOnLock(t, ns, lock)
	_, fired := st.waitNotified(t, "ExitGuardSyncLockStuck", "firing", cause, 120*time.Second, map[string]string{"lock": lock})
	t.Logf("over HTTPS with a bearer token: ExitGuardSyncLockStuck delivered %s after its cause", fired.Round(100*time.Millisecond))
}
