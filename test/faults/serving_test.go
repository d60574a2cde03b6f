//go:build envtest

package faults

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// startGuard runs a guard on a free webhook port with args; it is not behind the balancer.
func startGuard(t *testing.T, args ...string) (*testenv.Guard, string) {
	t.Helper()
	port := strconv.Itoa(testenv.TestPort(t))
	out := &testenv.Output{}
	g, err := testenv.StartGuard(t.Context(), guardBin, env.KubeConfig(),
		append([]string{"--webhook-port=" + port, "--webhook-cert-path=" + env.WebhookCertDir, "--shutdown-delay=0s"}, args...), out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { _ = g.Stop() })
	return g, net.JoinHostPort(env.WebhookHost, port)
}

// TestServingHardening checks, on the binary, what its webhook and metrics endpoints accept:
// TLS 1.2 at least, HTTP/2 only when asked for, no request past 7 MiB, and with
// --metrics-secure, metrics only for clients the API server authenticates and authorizes.
func TestServingHardening(t *testing.T) {
	g, webhookAddr := startGuard(t, "--metrics-secure")
	_, h2Addr := startGuard(t, "--enable-http2")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.WebhookCAData)
	dial := func(addr string, c *tls.Config) (*tls.ConnectionState, error) {
		c.RootCAs = pool
		conn, err := tls.Dial("tcp", addr, c)
		if err != nil {
			return nil, err
		}
		defer func() { _ = conn.Close() }()
		st := conn.ConnectionState()
		return &st, nil
	}

	t.Run("TLS 1.1 is refused, TLS 1.2 accepted", func(t *testing.T) {
		if _, err := dial(webhookAddr, &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}); err == nil { //nolint:gosec // G402: the test offers TLS 1.1 on purpose
			t.Error("the webhook accepted a TLS 1.1 handshake")
		}
		if _, err := dial(webhookAddr, &tls.Config{MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12}); err != nil {
			t.Errorf("the webhook refused TLS 1.2: %v", err)
		}
	})
	t.Run("HTTP/2 only when asked for", func(t *testing.T) {
		for _, tc := range []struct {
			addr, want string
		}{{webhookAddr, "http/1.1"}, {h2Addr, "h2"}} {
			st, err := dial(tc.addr, &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			if st.NegotiatedProtocol != tc.want {
				t.Errorf("negotiated %q, want %q", st.NegotiatedProtocol, tc.want)
			}
		}
	})
	t.Run("a request past 7 MiB gets HTTP 413", func(t *testing.T) {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
		body := bytes.Repeat([]byte("x"), 8<<20)
		resp, err := c.Post("https://"+webhookAddr+"/validate-pod", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("HTTP %d for an 8 MiB request, want 413", resp.StatusCode)
		}
	})
	t.Run("metrics behind authentication and authorization", func(t *testing.T) {
		cs, err := kubernetes.NewForConfig(env.Config)
		if err != nil {
			t.Fatal(err)
		}
		ns := newNamespace(t)
		token := func(sa string) string {
			if _, err := cs.CoreV1().ServiceAccounts(ns).Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return tr.Status.Token
		}
		role := "metrics-reader-" + rand.String(5)
		if _, err := cs.RbacV1().ClusterRoles().Create(t.Context(), &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
			Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(t.Context(), &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		allowed, other := token("prometheus"), token("somebody")
		// The secure metrics server makes its certificate and starts on its own, after
		// readiness may already pass.
		waitFor(t, "the metrics endpoint to listen", func() bool {
			conn, err := net.Dial("tcp", g.MetricsAddr)
			if err != nil {
				return false
			}
			_ = conn.Close()
			return true
		})
		// The metrics endpoint serves the webhook's certificate: a scraper verifies it with the
		// CA of the webhook's caBundle (the chart's ServiceMonitor, with the Secret's ca.crt).
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: env.WebhookHost, MinVersion: tls.VersionTLS12}}}
		for _, tc := range []struct {
			name, token string
			want        int
		}{{"no token", "", http.StatusUnauthorized}, {"a token the API server does not know", "not-a-token", http.StatusUnauthorized},
			{"a ServiceAccount without the permission", other, http.StatusForbidden}, {"a ServiceAccount with get on /metrics", allowed, http.StatusOK}} {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://"+g.MetricsAddr+"/metrics", nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			_, _ = fmt.Fprint(&b, resp.Status)
			_ = resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%s: %s, want %d", tc.name, b.String(), tc.want)
			}
		}
		// Reviews are cached by token, and new ones are bounded (5 a second past a burst of
		// 10): more scrapes with the allowed token cost no TokenReview; many junk tokens at
		// once cost at most the budget, and the rest are answered 429 unreviewed.
		scrape := func(tok string) int {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://"+g.MetricsAddr+"/metrics", nil)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			return resp.StatusCode
		}
		reviews := func() float64 {
			n, err := env.APIServerCounter(t.Context(), "apiserver_request_total", map[string]string{"resource": "tokenreviews"})
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := reviews()
		for range 20 {
			if code := scrape(allowed); code != http.StatusOK {
				t.Fatalf("a scrape with the allowed token: HTTP %d", code)
			}
		}
		if n := reviews() - before; n != 0 {
			t.Errorf("20 scrapes with a token reviewed a moment ago cost %v TokenReviews, want 0 (cached)", n)
		}
		before = reviews()
		start := time.Now()
		codes := map[int]int{}
		for i := range 40 {
			codes[scrape("junk-"+strconv.Itoa(i))]++
		}
		elapsed := time.Since(start)
		n := reviews() - before
		// The budget: the burst (less what the table above spent) and what refilled meanwhile,
		// and the budget of the addresses a token was allowed from (this test's own loopback
		// address, whose token was allowed above): its burst of 5 and 1 a second.
		budget := 10 + 5*elapsed.Seconds() + 1 + 5 + 1*elapsed.Seconds()
		t.Logf("40 junk tokens in %v: %v TokenReviews (budget %.1f), answers %v", elapsed.Round(time.Millisecond), n, budget, codes)
		if n > budget || codes[http.StatusTooManyRequests] == 0 || codes[http.StatusTooManyRequests]+codes[http.StatusUnauthorized] != 40 {
			t.Errorf("40 junk tokens cost %v TokenReviews (budget %.1f) and were answered %v: want at most the budget, the rest 429", n, budget, codes)
		}
		plain, err := http.Get("http://" + g.MetricsAddr + "/metrics") //nolint:noctx // a one-off probe
		if err == nil {
			_ = plain.Body.Close()
			if plain.StatusCode == http.StatusOK {
				t.Error("the secure metrics endpoint answers plain HTTP")
			}
		}
	})
}
