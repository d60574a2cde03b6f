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
	"errors"
	"fmt"
	"net/http"
	"strings"
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

// reviewTimeout bounds the two reviews of one scrape. Reviews are not cached: a scrape every
// few seconds costs the API server two small writes that it does not store.
const reviewTimeout = 10 * time.Second

// FilterProvider is a metricsserver.Options.FilterProvider.
func FilterProvider(c *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	cl, err := client.New(c, client.Options{Scheme: scheme, HTTPClient: httpClient})
	if err != nil {
		return nil, fmt.Errorf("metricsauth: %w", err)
	}
	return Filter(cl), nil
}

// Filter returns the filter, reviewing through c.
func Filter(c client.Client) metricsserver.Filter {
	return func(log logr.Logger, next http.Handler) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), reviewTimeout)
			defer cancel()
			status, err := review(ctx, c, r)
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

// review authenticates and authorizes r; on refusal it returns the HTTP status and the reason.
func review(ctx context.Context, c client.Client, r *http.Request) (int, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		return http.StatusUnauthorized, errors.New("unauthorized: a bearer token is required")
	}
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: strings.TrimSpace(token)}}
	if err := c.Create(ctx, tr); err != nil {
		return http.StatusInternalServerError, fmt.Errorf("reviewing the token: %w", err)
	}
	if !tr.Status.Authenticated {
		return http.StatusUnauthorized, errors.New("unauthorized: the API server does not know this token")
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
