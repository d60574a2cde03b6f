//go:build e2e

package e2e

import (
	"context"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// chartWebhook is the chart's own ValidatingWebhookConfiguration, rendered with the values set
// (helm's --set): its webhooks with their selectors and match conditions, as a user installs
// them.
func chartWebhook(t *testing.T, set ...string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	helmBin, err := testenv.HelmBin()
	if err != nil {
		t.Fatal(err)
	}
	vwc, err := testenv.ChartWebhook(helmBin, set...)
	if err != nil {
		t.Fatal(err)
	}
	return vwc
}

// startAPIServer starts an API server with opts and creates in it the test's namespace, its
// default ServiceAccount, the workflow-controller's ConfigMap (with data) and objects. The
// context it returns ends with stop, which then stops the API server: the caller defers stop.
func startAPIServer(t *testing.T, opts testenv.Options, data map[string]string, objects ...client.Object) (*testenv.Env, context.Context, func()) {
	t.Helper()
	env, err := testenv.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	stop := func() {
		cancel()
		_ = env.Stop()
	}
	for _, o := range append([]client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "default"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "workflow-controller-configmap"}, Data: data},
	}, objects...) {
		if err := env.Client.Create(ctx, o); err != nil {
			stop()
			t.Fatal(err)
		}
	}
	return env, ctx, stop
}
