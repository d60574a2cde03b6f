//go:build envtest

package chart

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// clientAs is a client of the test API server as the ServiceAccount ns/sa (impersonated).
func clientAs(t *testing.T, ns, sa string) client.Client {
	t.Helper()
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfigAs(t, ns, sa))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGuardIdentityChangesOnlyItsCABundle: in `self` certificate mode the guard's identity may
// update its own webhook configuration and Secret (RBAC, by name); the chart's
// ValidatingAdmissionPolicy lets it change only the caBundle of the one and the data of the
// other. Tried through the real API server as that identity, in enforce mode (a validating
// configuration) and warn mode (a mutating one), and in sidecar mode, where the identity is
// Argo's controller and its writes of other Secrets must stay untouched.
func TestGuardIdentityChangesOnlyItsCABundle(t *testing.T) {
	for _, p := range []profile{
		{name: "enforce"},
		{name: "warn", set: []string{"guard.mode=warn"}},
		{name: "sidecar", set: []string{"installMode=sidecar"}},
	} {
		t.Run(p.name, func(t *testing.T) {
			ns := newNamespace(t, nil)
			objs := render(t, p, "exit-guard", ns)
			policy := only(t, objs, "ValidatingAdmissionPolicy").GetName()
			webhooks := install(t, objs)
			for _, w := range webhooks {
				w := w.DeepCopy()
				if err := env.Client.Create(t.Context(), w); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = env.Client.Delete(context.Background(), w) })
			}
			sa := "exit-guard"
			if p.name == "sidecar" {
				sa = "argo-workflows-workflow-controller"
			}
			guard := clientAs(t, ns, sa)
			secretKey := client.ObjectKeyFromObject(only(t, objs, "Secret"))

			// change applies edit to the current object as the guard's identity.
			change := func(obj *unstructured.Unstructured, edit func(u *unstructured.Unstructured)) error {
				cur := &unstructured.Unstructured{}
				cur.SetGroupVersionKind(obj.GroupVersionKind())
				if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), cur); err != nil {
					t.Fatal(err)
				}
				edit(cur)
				return guard.Update(t.Context(), cur)
			}
			secret := &unstructured.Unstructured{}
			secret.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
			secret.SetNamespace(secretKey.Namespace)
			secret.SetName(secretKey.Name)
			refusedByPolicy := func(err error) bool {
				return apierrors.IsForbidden(err) && strings.Contains(err.Error(), policy)
			}
			// A policy takes effect shortly after it is created: wait until it refuses.
			if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				err := change(secret, func(u *unstructured.Unstructured) { setLabel(u, "probe", strconv.FormatInt(time.Now().UnixNano(), 10)) })
				return refusedByPolicy(err), nil
			}); err != nil {
				t.Fatalf("the policy %s never refused a label on the Secret, as the guard", policy)
			}

			hooks := func(edit func(w map[string]any)) func(u *unstructured.Unstructured) {
				return func(u *unstructured.Unstructured) {
					ws, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
					for _, w := range ws {
						edit(w.(map[string]any))
					}
					_ = unstructured.SetNestedSlice(u.Object, ws, "webhooks")
				}
			}
			first := func(edit func(w map[string]any)) func(u *unstructured.Unstructured) {
				return func(u *unstructured.Unstructured) {
					ws, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
					edit(ws[0].(map[string]any))
					_ = unstructured.SetNestedSlice(u.Object, ws, "webhooks")
				}
			}
			clientConfig := func(w map[string]any) map[string]any { return w["clientConfig"].(map[string]any) }
			for i, cfg := range webhooks {
				for _, tc := range []struct {
					name string
					obj  *unstructured.Unstructured
					edit func(u *unstructured.Unstructured)
					ok   bool
				}{
					{"the caBundle of every webhook", cfg, hooks(func(w map[string]any) { clientConfig(w)["caBundle"] = "Y2E=" }), true},
					{"the Secret's data", secret, func(u *unstructured.Unstructured) {
						_ = unstructured.SetNestedField(u.Object, "Y2VydA==", "data", "tls.crt")
					}, true},
					{"rules: every resource", cfg, first(func(w map[string]any) {
						w["rules"] = []any{map[string]any{"apiGroups": []any{"*"}, "apiVersions": []any{"*"}, "operations": []any{"*"}, "resources": []any{"*/*"}, "scope": "*"}}
					}), false},
					{"the URL: elsewhere", cfg, first(func(w map[string]any) {
						cc := clientConfig(w)
						delete(cc, "service")
						cc["url"] = "https://collector.example/hook"
					}), false},
					{"the Service", cfg, first(func(w map[string]any) {
						clientConfig(w)["service"].(map[string]any)["name"] = "other"
					}), false},
					{"the Service's path", cfg, first(func(w map[string]any) {
						clientConfig(w)["service"].(map[string]any)["path"] = "/other"
					}), false},
					{"the failure policy", cfg, first(func(w map[string]any) {
						if w["failurePolicy"] == "Fail" {
							w["failurePolicy"] = "Ignore"
						} else {
							w["failurePolicy"] = "Fail"
						}
					}), false},
					{"the namespace selector", cfg, first(func(w map[string]any) { w["namespaceSelector"] = map[string]any{} }), false},
					{"the object selector", cfg, first(func(w map[string]any) {
						w["objectSelector"] = map[string]any{"matchLabels": map[string]any{"x": "y"}}
					}), false},
					{"the match conditions", cfg, first(func(w map[string]any) {
						w["matchConditions"] = []any{map[string]any{"name": "all", "expression": "true"}}
					}), false},
					{"the timeout", cfg, first(func(w map[string]any) { w["timeoutSeconds"] = int64(29) }), false},
					{"the Service's port", cfg, first(func(w map[string]any) {
						clientConfig(w)["service"].(map[string]any)["port"] = int64(8443)
					}), false},
					{"the Service's namespace", cfg, first(func(w map[string]any) {
						clientConfig(w)["service"].(map[string]any)["namespace"] = "elsewhere"
					}), false},
					{"the match policy", cfg, first(func(w map[string]any) {
						if w["matchPolicy"] == "Exact" {
							w["matchPolicy"] = "Equivalent"
						} else {
							w["matchPolicy"] = "Exact"
						}
					}), false},
					{"the review versions", cfg, first(func(w map[string]any) { w["admissionReviewVersions"] = []any{"v1", "v1beta1"} }), false},
					{"a webhook renamed", cfg, first(func(w map[string]any) { w["name"] = "renamed.exit-guard.io" }), false},
					{"the side effects", cfg, first(func(w map[string]any) {
						if w["sideEffects"] == "None" {
							w["sideEffects"] = "NoneOnDryRun"
						} else {
							w["sideEffects"] = "None"
						}
					}), false},
					{"a webhook more", cfg, func(u *unstructured.Unstructured) {
						ws, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
						extra := runtimeCopy(ws[0].(map[string]any))
						extra["name"] = "extra.exit-guard.io"
						_ = unstructured.SetNestedSlice(u.Object, append(ws, extra), "webhooks")
					}, false},
					{"a label on the configuration", cfg, func(u *unstructured.Unstructured) { setLabel(u, "x", "y") }, false},
					{"an annotation on the configuration", cfg, func(u *unstructured.Unstructured) {
						u.SetAnnotations(map[string]string{"x": "y"})
					}, false},
					{"the Secret made immutable", secret, func(u *unstructured.Unstructured) { u.Object["immutable"] = true }, false},
					{"an annotation on the Secret", secret, func(u *unstructured.Unstructured) { u.SetAnnotations(map[string]string{"x": "y"}) }, false},
				} {
					if tc.obj == secret && i > 0 {
						continue
					}
					err := change(tc.obj, tc.edit)
					switch {
					case tc.ok && err != nil:
						t.Errorf("%s %s: %s: refused as the guard: %v", cfg.GetKind(), cfg.GetName(), tc.name, err)
					case !tc.ok && !refusedByPolicy(err):
						t.Errorf("%s %s: %s: %v, want refused by %s", cfg.GetKind(), cfg.GetName(), tc.name, err, policy)
					case !tc.ok && !strings.Contains(err.Error(), wantMessage(tc.obj == secret, tc.name)):
						// Not an evaluation error of the policy, which would refuse as well.
						t.Errorf("%s %s: %s: refused saying %v, want %q", cfg.GetKind(), cfg.GetName(), tc.name, err, wantMessage(tc.obj == secret, tc.name))
					}
				}
				if len(webhookNames(t, cfg)) > 1 {
					err := change(cfg, func(u *unstructured.Unstructured) {
						ws, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
						_ = unstructured.SetNestedSlice(u.Object, ws[1:], "webhooks")
					})
					if !refusedByPolicy(err) {
						t.Errorf("%s: a webhook less: %v, want refused by %s", cfg.GetKind(), err, policy)
					}
				}
			}

			// Creating a configuration and deleting its own: its RBAC has no such verbs.
			cfg := webhooks[0]
			other := cfg.DeepCopy()
			other.SetName("collector")
			other.SetResourceVersion("")
			if err := guard.Create(t.Context(), other); !apierrors.IsForbidden(err) {
				t.Errorf("creating a webhook configuration as the guard: %v, want forbidden", err)
				_ = env.Client.Delete(t.Context(), other)
			}
			if err := guard.Delete(t.Context(), cfg); !apierrors.IsForbidden(err) {
				t.Errorf("deleting its own webhook configuration as the guard: %v, want forbidden", err)
			}

			// Other objects of the identity are not the policy's: granted a Secret of its own
			// (as Argo's controller has its agent's CA), it writes it freely.
			role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other-secrets"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "update", "get"}}}}
			binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other-secrets"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}}}
			for _, o := range []client.Object{role, binding} {
				if err := env.Client.Create(t.Context(), o); err != nil {
					t.Fatal(err)
				}
			}
			own := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent-ca", Labels: map[string]string{"a": "b"}}}
			if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
				return guard.Create(ctx, own) == nil, nil
			}); err != nil {
				t.Errorf("creating another Secret as the guard's identity, with the RBAC to: refused")
			}
		})
	}
}

// setLabel sets one label of u.
func setLabel(u *unstructured.Unstructured, k, v string) {
	l := u.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	l[k] = v
	u.SetLabels(l)
}

// runtimeCopy deep-copies a webhook.
func runtimeCopy(w map[string]any) map[string]any {
	return runtime.DeepCopyJSON(w)
}

// webhookNames are the names of the webhooks of a configuration, as the API server holds it.
func webhookNames(t *testing.T, cfg *unstructured.Unstructured) []string {
	t.Helper()
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(cfg.GroupVersionKind())
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(cfg), cur); err != nil {
		t.Fatal(err)
	}
	ws, _, _ := unstructured.NestedSlice(cur.Object, "webhooks")
	var names []string
	for _, w := range ws {
		names = append(names, w.(map[string]any)["name"].(string))
	}
	return names
}

// wantMessage is the policy's message for a refused change of the case named name.
func wantMessage(secret bool, name string) string {
	switch {
	case strings.Contains(name, "label") || strings.Contains(name, "annotation"):
		return "changes no labels, annotations, owner references or finalizers"
	case secret:
		return "changes only the data of its Secret"
	}
	return "changes only the caBundle of its webhooks"
}

// TestClientCAIsHeldByThePolicy: with webhook.clientAuth the guard answers only clients whose
// certificate the CA in a ConfigMap of its namespace signed; whoever could change that CA could
// forge reviews. The chart's ValidatingAdmissionPolicy refuses every create, change and deletion
// of that ConfigMap but by the users of webhook.clientAuth.caWriters: tried through the real API server
// as an editor of the namespace (RBAC lets it update and delete ConfigMaps), as a writer the
// values name, and as the cluster's administrator.
func TestClientCAIsHeldByThePolicy(t *testing.T) {
	ns := newNamespace(t, nil)
	writer := "system:serviceaccount:" + ns + ":ca-rotator"
	objs := render(t, profile{name: "client-ca", set: []string{"webhook.clientAuth.caConfigMap=client-ca", "webhook.clientAuth.caWriters={" + writer + "}"}}, "exit-guard", ns)
	var policy string
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicy" && strings.HasSuffix(o.GetName(), "-client-ca") {
			policy = o.GetName()
		}
	}
	if policy == "" {
		t.Fatal("the chart renders no ValidatingAdmissionPolicy <fullname>-client-ca with webhook.clientAuth.caConfigMap set")
	}
	install(t, objs)
	ca := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "client-ca"}, Data: map[string]string{"ca.crt": "the API server's client CA"}}
	for _, sa := range []string{"editor", "ca-rotator"} {
		for _, o := range []client.Object{
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}},
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update", "patch", "delete"}}}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}},
		} {
			if err := env.Client.Create(t.Context(), o); err != nil {
				t.Fatal(err)
			}
		}
	}
	refusedByPolicy := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), policy)
	}
	editor := clientAs(t, ns, "editor")
	rotator := clientAs(t, ns, "ca-rotator")
	// The ConfigMap may come after the chart: an editor of the namespace must not be the one
	// who creates it first, with a CA of their own that the policy would then shield. A policy
	// takes effect shortly after it is created: wait until it refuses. A create it let in before
	// then is taken back by the writer, whom the policy always lets delete: the editor's own
	// delete may come after the policy took effect and be refused.
	if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		forged := ca.DeepCopy()
		forged.Data["ca.crt"] = "a CA the editor holds the key of"
		err := editor.Create(ctx, forged)
		if err == nil {
			if err := rotator.Delete(ctx, forged); err != nil {
				return false, fmt.Errorf("taking back a create let in before the policy took effect: %w", err)
			}
		}
		return refusedByPolicy(err), nil
	}); err != nil {
		t.Fatalf("the policy %s never refused an editor of the namespace creating the client CA first: %v", policy, err)
	}
	if err := env.Client.Create(t.Context(), ca.DeepCopy()); !refusedByPolicy(err) {
		t.Errorf("the cluster's administrator creating the client CA: %v, want refused by %s (caWriters names who may)", err, policy)
	}
	if err := rotator.Create(t.Context(), ca); err != nil {
		t.Fatalf("the writer webhook.clientAuth.caWriters names, creating the client CA: %v, want admitted", err)
	}
	swap := func(c client.Client, value string) error {
		cur := &corev1.ConfigMap{}
		if err := c.Get(t.Context(), client.ObjectKeyFromObject(ca), cur); err != nil {
			t.Fatal(err)
		}
		cur.Data["ca.crt"] = value
		return c.Update(t.Context(), cur)
	}
	if err := swap(editor, "a CA the editor holds the key of"); !refusedByPolicy(err) {
		t.Errorf("an editor of the namespace swapping the client CA: %v, want refused by %s", err, policy)
	}
	if err := editor.Delete(t.Context(), ca); !refusedByPolicy(err) {
		t.Errorf("an editor of the namespace deleting the client CA: %v, want refused by %s", err, policy)
	}
	if err := swap(env.Client, "the administrator's CA"); !refusedByPolicy(err) {
		t.Errorf("the cluster's administrator swapping the client CA: %v, want refused by %s (caWriters names who may)", err, policy)
	}
	if err := swap(rotator, "the rotated CA"); err != nil {
		t.Errorf("the writer webhook.clientAuth.caWriters names, rotating the client CA: %v, want admitted", err)
	}
	// The namespace deleted: its ConfigMaps go with it (the namespace controller deletes them),
	// or it would stay Terminating.
	if err := env.Client.Delete(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := editor.Delete(ctx, ca)
		return err == nil || apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Errorf("deleting the client CA while its namespace is Terminating: still refused after 30 s")
	}
}
