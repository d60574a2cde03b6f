// Package metricsauth puts exit-guard's metrics endpoint behind the API server's
// authentication and authorization: a client shows a bearer token, the API server says who it
// is (TokenReview) and whether it may get the endpoint's URL (SubjectAccessReview, as for
// `nonResourceURLs: ["/metrics"]`, `verbs: ["get"]`), as kube-rbac-proxy and
// controller-runtime's metrics filter do. It is written here rather than taken from
// controller-runtime's filters package, which brings in k8s.io/apiserver and made the binary
// 30 MB larger for these two API calls.
package metricsauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The filter asks the API server who a client is and what it may do.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// reviewTimeout bounds the two reviews of one scrape.
const reviewTimeout = 10 * time.Second

// Reviews are cached by token, path and verb, as kube-rbac-proxy and controller-runtime's
// delegating filter do: an admission for allowedFor, a refusal for deniedFor (a token that
// becomes valid, or a permission granted, is seen within seconds). A token not in the cache
// costs a TokenReview (and a SubjectAccessReview): at most reviewRate a second past a burst of
// reviewBurst, so that fresh junk tokens cost the API server a bounded load; past it, 429. A
// token allowed within knownFor is reviewed again outside that budget when its cached review
// expires: a flood of junk tokens cannot keep the scraper out (its alerts blind, the guard's
// replicas looking down), and it costs the API server at most one review per allowed token
// each allowedFor, since only a token the API server allowed gets there. A scraper's token
// rotates (a projected ServiceAccount token, about hourly), and the new one is a new key: a
// token from a source address that a token was allowed from within knownFor is reviewed from a
// budget of its own (knownSourceRate, knownSourceBurst), which tokens from other addresses
// cannot spend, so that the rotated token is not starved by a flood from elsewhere.
const (
	allowedFor       = 2 * time.Minute
	deniedFor        = 10 * time.Second
	knownFor         = 10 * time.Minute
	reviewRate       = 5.0
	reviewBurst      = 10.0
	knownSourceRate  = 1.0
	knownSourceBurst = 5.0
	maxCachedFor     = 1000
)

// FilterProvider returns a metricsserver.Options.FilterProvider whose filter accepts tokens
// issued for one of audiences (none: the API server's own audiences).
func FilterProvider(audiences []string) func(c *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	return func(c *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
		scheme := runtime.NewScheme()
		if err := clientgoscheme.AddToScheme(scheme); err != nil {
			return nil, err
		}
		cl, err := client.New(c, client.Options{Scheme: scheme, HTTPClient: httpClient})
		if err != nil {
			return nil, fmt.Errorf("metricsauth: %w", err)
		}
		return Filter(cl, audiences), nil
	}
}

// Filter returns the filter, reviewing through c tokens issued for one of audiences (none:
// the API server's own).
func Filter(c client.Client, audiences []string) metricsserver.Filter {
	return filter(c, audiences, time.Now)
}

func filter(c client.Client, audiences []string, now func() time.Time) metricsserver.Filter {
	cache := &reviews{now: now, m: map[[sha256.Size]byte]verdict{}, known: map[[sha256.Size]byte]time.Time{}, sources: map[string]time.Time{},
		budget:      bucket{rate: reviewRate, burst: reviewBurst, tokens: reviewBurst, last: now()},
		knownBudget: bucket{rate: knownSourceRate, burst: knownSourceBurst, tokens: knownSourceBurst, last: now()}}
	return func(log logr.Logger, next http.Handler) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, src := cacheKey(r), source(r)
			v, cached := cache.get(key)
			status, err := v.status, v.err
			if !cached {
				if !cache.knows(key) && !cache.take(src) {
					log.V(1).Info("metrics request refused: too many tokens to review")
					http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
					return
				}
				ctx, cancel := context.WithTimeout(r.Context(), reviewTimeout)
				status, err = review(ctx, c, audiences, r)
				cancel()
				cache.put(key, src, status, err)
			}
			if err != nil {
				// The caller learns the status only; the reason, which may quote the API
				// server, goes to the log.
				log.V(1).Info("metrics request refused", "status", status, "reason", err.Error())
				http.Error(w, http.StatusText(status), status)
				return
			}
			next.ServeHTTP(w, r)
		}), nil
	}
}

// review authenticates r's token, issued for one of audiences (none: the API server's own), and
// authorizes its user; on refusal it returns the HTTP status and the reason.
func review(ctx context.Context, c client.Client, audiences []string, r *http.Request) (int, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		return http.StatusUnauthorized, errors.New("unauthorized: a bearer token is required")
	}
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: strings.TrimSpace(token), Audiences: audiences}}
	if err := c.Create(ctx, tr); err != nil {
		return http.StatusInternalServerError, fmt.Errorf("reviewing the token: %w", err)
	}
	if !tr.Status.Authenticated {
		return http.StatusUnauthorized, errors.New("unauthorized: the API server does not know this token")
	}
	// The API server answers with the requested audiences the token is valid for; a server
	// that ignores audiences answers none, which must not pass as a match.
	if len(audiences) > 0 && !slices.ContainsFunc(tr.Status.Audiences, func(a string) bool { return slices.Contains(audiences, a) }) {
		return http.StatusUnauthorized, fmt.Errorf("unauthorized: the token is not issued for %s", strings.Join(audiences, ", "))
	}
	u := tr.Status.User
	extra := make(map[string]authorizationv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: r.URL.Path, Verb: strings.ToLower(r.Method)},
	}}
	if err := c.Create(ctx, sar); err != nil {
		return http.StatusInternalServerError, fmt.Errorf("reviewing the access: %w", err)
	}
	if !sar.Status.Allowed {
		return http.StatusForbidden, fmt.Errorf("forbidden: %s may not %s %s", u.Username, strings.ToLower(r.Method), r.URL.Path)
	}
	return http.StatusOK, nil
}

// verdict is a cached review: the status and reason of a refusal (nil: allowed), until when.
type verdict struct {
	status int
	err    error
	until  time.Time
}

// reviews caches the reviews, remembers the keys and the source addresses allowed lately
// (known, sources: when each was last allowed), and holds the budgets of new reviews: one for
// every source, one that only the sources allowed lately may spend.
type reviews struct {
	now func() time.Time

	mu          sync.Mutex
	m           map[[sha256.Size]byte]verdict
	known       map[[sha256.Size]byte]time.Time
	sources     map[string]time.Time
	budget      bucket
	knownBudget bucket
}

// bucket is a token bucket: rate a second, up to burst.
type bucket struct {
	rate, burst float64
	tokens      float64
	last        time.Time
}

// take spends one token at now, if there is one.
func (b *bucket) take(now time.Time) bool {
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// source is the address a request came from, without its port.
func source(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// cacheKey is the digest of the request's Authorization header, path and verb.
func cacheKey(r *http.Request) [sha256.Size]byte {
	return sha256.Sum256([]byte(r.Header.Get("Authorization") + "\x00" + r.URL.Path + "\x00" + r.Method))
}

// get returns the cached review of key, if it has not expired.
func (c *reviews) get(key [sha256.Size]byte) (verdict, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[key]
	if !ok || !c.now().Before(v.until) {
		return verdict{}, false
	}
	return v, true
}

// put caches an answer of the API server for key, sent from src; a failure to ask it (500) is
// not cached.
func (c *reviews) put(key [sha256.Size]byte, src string, status int, err error) {
	if status == http.StatusInternalServerError {
		return
	}
	now := c.now()
	until := now.Add(allowedFor)
	if err != nil {
		until = now.Add(deniedFor)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		remember(c.known, key, now)
		remember(c.sources, src, now)
	}
	if _, ok := c.m[key]; !ok && len(c.m) >= maxCachedFor {
		for k, v := range c.m {
			if !now.Before(v.until) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxCachedFor {
			return
		}
	}
	c.m[key] = verdict{status: status, err: err, until: until}
}

// remember records in m that key (a token's, or a source's) was allowed at now, within
// maxCachedFor keys: full, it forgets the keys not allowed within knownFor, and, if still full,
// remembers nothing new (the budget then reviews it, as before it was known). Called with c.mu
// held.
func remember[K comparable](m map[K]time.Time, key K, now time.Time) {
	if _, ok := m[key]; !ok && len(m) >= maxCachedFor {
		for k, at := range m {
			if now.Sub(at) > knownFor {
				delete(m, k)
			}
		}
		if len(m) >= maxCachedFor {
			return
		}
	}
	m[key] = now
}

// knows says whether key was allowed within knownFor: its review is not taken from the budget.
func (c *reviews) knows(key [sha256.Size]byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.known[key]
	return ok && c.now().Sub(at) <= knownFor
}

// take spends one review for a token sent from src, if there is one: from the known sources'
// budget first when a token was allowed from src within knownFor, else from everyone's.
func (c *reviews) take(src string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if at, ok := c.sources[src]; ok && now.Sub(at) <= knownFor && c.knownBudget.take(now) {
		return true
	}
	return c.budget.take(now)
}
