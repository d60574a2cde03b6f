#!/usr/bin/env bash
# Builds the parts of cert-manager that the certificate-renewal test runs (make e2e-certmanager):
# its controller (the issuers, the certificates' and the certificate requests' control loops,
# with the CA and self-signed issuers) and its cainjector, from Go modules only, into one binary
# in the user's cache directory keyed by version, with cert-manager's CRDs beside it. A fresh
# clone reuses them.
#
# cert-manager's commands live in modules of their own that the module proxy does not serve;
# its control loops live in the main module, github.com/cert-manager/cert-manager, which it
# does. A small wrapper module requires that module at the release's version; its main starts
# the control loops the way cert-manager's own controller and cainjector commands do
# (controller.NewContextFactory and the registered constructors; cainjector.RegisterAllInjectors
# on a controller-runtime manager), with their default settings and no ACME, Vault or Venafi.
#
# Usage: hack/certmanager-binaries.sh [ensure|path]
#   ensure  build what is missing, then print the folder (default)
#   path    print the folder without building anything
# The folder holds cert-manager (cert-manager controller|cainjector --kubeconfig=FILE) and crds/.
#
# Environment:
#   CERT_MANAGER_VERSION  (default: hack/versions.env)
#   EXIT_GUARD_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard)
set -euo pipefail

# shellcheck source=versions.env
DEFAULT=$(. "$(dirname "$0")/versions.env" && echo "$CERT_MANAGER_VERSION")
CERT_MANAGER_VERSION=${CERT_MANAGER_VERSION:-$DEFAULT}
CACHE_ROOT=${EXIT_GUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exit-guard}
DIR="$CACHE_ROOT/cert-manager/${CERT_MANAGER_VERSION}-$(go env GOOS)-$(go env GOARCH)"
MOD=github.com/cert-manager/cert-manager
# The wrapper's revision: a build of an older one is made again.
WRAPPER=2

log() { echo "certmanager-binaries: $*" >&2; }

fail() {
  log "FAILED: $*"
  log "Rerun 'make certmanager-binaries' (or hack/certmanager-binaries.sh) and read the output above."
  log "It needs the Go module proxy and about 5 minutes on 2 cores the first time."
  exit 1
}

build() {
  if [ -x "$DIR/cert-manager" ] && [ -f "$DIR/cert-manager.version" ] &&
    [ "$(cat "$DIR/cert-manager.version")" = "$CERT_MANAGER_VERSION $WRAPPER" ] &&
    [ -f "$DIR/crds/cert-manager.io_certificates.yaml" ]; then
    return 0
  fi
  log "building cert-manager $CERT_MANAGER_VERSION's controller and cainjector (about 5 minutes the first time)..."
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  mkdir -p "$DIR/crds"
  (
    export GOFLAGS=-mod=mod
    cd "$tmp"
    read -r gomod moddir < <(go mod download -json "$MOD@$CERT_MANAGER_VERSION" |
      sed -n 's/^[[:space:]]*"\(GoMod\|Dir\)": "\(.*\)",$/\2/p' | tr '\n' ' ')
    [ -f "$gomod" ] && [ -d "$moddir" ] || { log "could not download $MOD@$CERT_MANAGER_VERSION"; exit 1; }
    go mod init exit-guard.local/cert-manager >/dev/null 2>&1
    go mod edit -go="$(sed -n 's/^go //p' "$gomod")" -require "$MOD@$CERT_MANAGER_VERSION" || exit 1
    cat >main.go <<'GO'
// Command cert-manager runs one of two parts of cert-manager, named by its first argument:
// controller (the control loops that issue and renew Certificates from CA and self-signed
// Issuers) or cainjector (which writes a Certificate's CA into the webhook configurations
// that name it). Both take --kubeconfig; the controller takes --namespace too.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sync/errgroup"
	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"

	// The control loops a CA and a self-signed Issuer need; each registers itself.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// loops are the control loops the controller starts, by the names they register.
var loops = []string{
	"issuers",
	"certificaterequests-approver", "certificaterequests-issuer-ca", "certificaterequests-issuer-selfsigned",
	"certificates-trigger", "certificates-key-manager", "certificates-request-manager",
	"certificates-issuing", "certificates-readiness", "certificates-revision-manager",
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cert-manager controller|cainjector --kubeconfig=FILE [--namespace=NS]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file")
	namespace := fs.String("namespace", "", "the only namespace to act in (empty: all)")
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	fs.Func("v", "log verbosity", func(s string) error { return klogFlags.Set("v", s) })
	_ = fs.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, klog.Background(), os.Args[1])
	var err error
	switch os.Args[1] {
	case "controller":
		err = controller(ctx, *kubeconfig, *namespace)
	case "cainjector":
		err = injector(ctx, *kubeconfig, *namespace)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// controller does what cert-manager's controller command does with its defaults: one context
// factory, every enabled loop built from it and run with 5 workers, then the informers started.
func controller(ctx context.Context, kubeconfig, namespace string) error {
	factory, err := controllerpkg.NewContextFactory(ctx, controllerpkg.ContextOptions{
		Kubeconfig: kubeconfig, KubernetesAPIQPS: 20, KubernetesAPIBurst: 50, Namespace: namespace,
		IssuerOptions: controllerpkg.IssuerOptions{ClusterResourceNamespace: "kube-system"},
	})
	if err != nil {
		return err
	}
	base, err := factory.Build()
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	known := controllerpkg.Known()
	for _, name := range loops {
		construct, ok := known[name]
		if !ok {
			return fmt.Errorf("cert-manager registered no control loop %q", name)
		}
		loop, err := construct(factory)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		g.Go(func() error { return loop.Run(5, ctx) })
	}
	base.SharedInformerFactory.Start(ctx.Done())
	base.KubeSharedInformerFactory.Start(ctx.Done())
	return g.Wait()
}

// injector does what cert-manager's cainjector command does with its defaults: a manager that
// caches no Secret, and the injectors of webhook configurations, APIServices and CRDs, with
// Certificates as a source.
func injector(ctx context.Context, kubeconfig, namespace string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	// Its user agent names the field manager of its apply patches, as in cert-manager's own.
	cfg = util.RestConfigWithUserAgent(cfg, "cainjector")
	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiext.AddToScheme(scheme))
	ctrl.SetLogger(klog.Background())
	var namespaces map[string]cache.Config
	if namespace != "" {
		namespaces = map[string]cache.Config{namespace: {}}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   cache.Options{ReaderFailOnMissingInformer: true, DefaultNamespaces: namespaces},
		Client:  client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return err
	}
	if err := cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		Namespace:                    namespace,
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
		},
	}); err != nil {
		return err
	}
	return mgr.Start(ctx)
}
GO
    # (errexit does not hold in a subshell left of ||: each step says so itself.)
    go mod tidy >&2 || exit 1
    CGO_ENABLED=0 go build -trimpath -o "$DIR/cert-manager.tmp" . >&2 || exit 1
    for crd in certificates certificaterequests issuers clusterissuers; do
      cp "$moddir/deploy/crds/cert-manager.io_$crd.yaml" "$DIR/crds/" || exit 1
    done
  ) || fail "cert-manager $CERT_MANAGER_VERSION did not build"
  mv "$DIR/cert-manager.tmp" "$DIR/cert-manager"
  echo "$CERT_MANAGER_VERSION $WRAPPER" >"$DIR/cert-manager.version"
  log "cert-manager $CERT_MANAGER_VERSION ready"
}

case "${1:-ensure}" in
  path) echo "$DIR" ;;
  ensure)
    build
    echo "$DIR"
    ;;
  *) echo "usage: $0 [ensure|path]" >&2; exit 2 ;;
esac
