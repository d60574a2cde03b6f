//go:build envtest

package metricsauth

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Options{}, &env))
}

// readerToken is a token of a new ServiceAccount that may get /metrics, issued for audiences
// (none: the API server's own).
func readerToken(t *testing.T, audiences ...string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	name := "reader-" + rand.String(5)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(name).Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(t.Context(), &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(t.Context(), &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: name}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(name).CreateToken(t.Context(), "prometheus",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// scraper serves h's filter, as metricsserver would, to an always-200 handler, for requests from
// the scraper's address.
func scraper(t *testing.T, f func(logr.Logger, http.Handler) (http.Handler, error)) func(token string) int {
	t.Helper()
	from := scraperFrom(t, f)
	return func(token string) int { return from(token, scraperAddr) }
}

// scraperAddr is the address the scraper's requests come from, elsewhere another client's.
const (
	scraperAddr   = "10.0.0.7:41000"
	elsewhereAddr = "10.0.9.9:52000"
)

// scraperFrom serves h's filter, as metricsserver would, to an always-200 handler, for requests
// from the address given.
func scraperFrom(t *testing.T, f func(logr.Logger, http.Handler) (http.Handler, error)) func(token, addr string) int {
	t.Helper()
	h, err := f(logr.Discard(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	if err != nil {
		t.Fatal(err)
	}
	return func(token, addr string) int {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
}

// With audiences, only a token issued for one of them passes (a token for the API server, which
// the guard could replay there, does not); without, only the API server's own.
func TestTokenAudiences(t *testing.T) {
	forGuard, forAPIServer := readerToken(t, "exit-guard"), readerToken(t)
	for _, tc := range []struct {
		name      string
		audiences []string
		token     string
		want      int
	}{
		{"audience exit-guard, a token issued for it", []string{"exit-guard"}, forGuard, http.StatusOK},
		{"audience exit-guard, a token issued for the API server", []string{"exit-guard"}, forAPIServer, http.StatusUnauthorized},
		{"audiences exit-guard and another, a token issued for exit-guard", []string{"another", "exit-guard"}, forGuard, http.StatusOK},
		{"no audience set, a token issued for the API server", nil, forAPIServer, http.StatusOK},
		{"no audience set, a token issued for exit-guard", nil, forGuard, http.StatusUnauthorized},
	} {
		scrape := scraper(t, Filter(env.Client, tc.audiences))
		if got := scrape(tc.token); got != tc.want {
			t.Errorf("%s: HTTP %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A flood of unknown tokens spends the review budget; the scraper whose token was allowed
// before is reviewed again when its cached review expires, whatever the flood left: its alerts
// do not go blind, and the flood still costs the API server no more than the budget.
func TestAllowedScraperIsReviewedAgainThroughAFlood(t *testing.T) {
	now := time.Unix(1000, 0)
	from := scraperFrom(t, filter(env.Client, nil, func() time.Time { return now }))
	scrape := func(token string) int { return from(token, scraperAddr) }
	junk := func(token string) int { return from(token, elsewhereAddr) }
	prometheus := readerToken(t)
	if code := scrape(prometheus); code != http.StatusOK {
		t.Fatalf("the scraper's first scrape: HTTP %d, want 200", code)
	}
	// Its review expires; meanwhile, at the same instant, junk tokens empty the budget.
	now = now.Add(allowedFor + time.Second)
	codes := map[int]int{}
	for i := range 3 * int(reviewBurst) {
		codes[junk("junk-"+strconv.Itoa(i))]++
	}
	if codes[http.StatusUnauthorized] != int(reviewBurst) || codes[http.StatusTooManyRequests] != 2*int(reviewBurst) {
		t.Fatalf("%d junk tokens at once were answered %v, want %d reviewed (401), the rest 429", 3*int(reviewBurst), codes, int(reviewBurst))
	}
	if code := scrape(prometheus); code != http.StatusOK {
		t.Errorf("the scraper's scrape once its review expired, the budget spent by junk tokens: HTTP %d, want 200", code)
	}
	if code := junk("junk-after"); code != http.StatusTooManyRequests {
		t.Errorf("another unknown token after it: HTTP %d, want 429 (the budget is still spent)", code)
	}
}

// A scraper's token rotates (a projected ServiceAccount token, about hourly): the new one is a
// new key, never allowed before. Reviewed from the budget of the addresses a token was allowed
// from, it passes while a flood of junk tokens from elsewhere keeps everyone's budget spent;
// a new token from elsewhere still waits in that budget.
func TestARotatedTokenIsNotStarvedByAFlood(t *testing.T) {
	now := time.Unix(1000, 0)
	scrape := scraperFrom(t, filter(env.Client, nil, func() time.Time { return now }))
	before := readerToken(t)
	if code := scrape(before, scraperAddr); code != http.StatusOK {
		t.Fatalf("the scraper's first scrape: HTTP %d, want 200", code)
	}
	rotated := readerToken(t)
	// The flood goes on: each second, more junk tokens from elsewhere than the budget refills.
	for sec := range 5 {
		now = now.Add(time.Second)
		for i := range 2 * int(reviewBurst) {
			scrape("junk-"+strconv.Itoa(sec)+"-"+strconv.Itoa(i), elsewhereAddr)
		}
	}
	if code := scrape("junk-last", elsewhereAddr); code != http.StatusTooManyRequests {
		t.Fatalf("a junk token once the flood has spent the budget: HTTP %d, want 429 (the flood is too weak to prove anything)", code)
	}
	if code := scrape(rotated, scraperAddr); code != http.StatusOK {
		t.Errorf("the scraper's rotated token through the flood: HTTP %d, want 200", code)
	}
	if code := scrape(readerToken(t), elsewhereAddr); code != http.StatusTooManyRequests {
		t.Errorf("a new token from an address no token was allowed from, through the flood: HTTP %d, want 429", code)
	}
}
