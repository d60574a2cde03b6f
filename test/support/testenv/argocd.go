package testenv

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ArgoCDDir is the folder holding the real Argo CD (its application controller and repo server
// in one binary, argocd, and its CRDs in crds/) that hack/argocd-binaries.sh builds:
// $EXIT_GUARD_ARGOCD_BIN when set, else the script's cache folder. It fails with a message
// that says how to get it when it is missing.
func ArgoCDDir() (string, error) {
	files := []string{"argocd", filepath.Join("crds", "application-crd.yaml"), filepath.Join("crds", "appproject-crd.yaml")}
	return cachedDir("EXIT_GUARD_ARGOCD_BIN", "argocd-binaries.sh", files, func(dir, f string) error {
		return fmt.Errorf("the GitOps proof needs a real Argo CD, and %s has no %s: run 'make e2e-argocd' (it builds "+
			"Argo CD's application controller and repo server from Go modules, about 10 minutes the first time) or 'make argocd-binaries'", dir, f)
	})
}

// ArgoCD is what an Argo CD part needs to run beside the test API server: the Argo CD folder
// (ArgoCDDir), a work folder, the Redis address, a kubeconfig file whose context's namespace
// is Argo CD's, and a folder of tools it runs (helm, found on its PATH with git).
type ArgoCD struct {
	Dir, Work, Redis, KubeConfig, Tools string
}

// environ is the environment of a part: run as Argo CD runs its own end-to-end tests outside
// a cluster (ARGOCD_FAKE_IN_CLUSTER), with no GPG and its data folders under Work.
func (a ArgoCD) environ() []string {
	// Argo CD's folder too: the repo server runs its git-verify-wrapper.sh.
	path := strings.Join([]string{a.Tools, a.Dir, os.Getenv("PATH")}, string(os.PathListSeparator))
	return []string{
		"PATH=" + path, "HOME=" + filepath.Join(a.Work, "home"), "KUBECONFIG=" + a.KubeConfig,
		"ARGOCD_FAKE_IN_CLUSTER=true", "ARGOCD_GPG_ENABLED=false",
		"ARGOCD_TLS_DATA_PATH=" + filepath.Join(a.Work, "tls"), "ARGOCD_SSH_DATA_PATH=" + filepath.Join(a.Work, "ssh"),
		"ARGOCD_GNUPGHOME=" + filepath.Join(a.Work, "gpg"), "HOSTNAME=argocd-application-controller-0",
	}
}

// StartRepoServer runs Argo CD's repo server, plain gRPC on a free loopback port (grpcAddr;
// Process.Addr is its metrics address).
func (a ArgoCD) StartRepoServer(ctx context.Context, out io.Writer) (p *Tool, grpcAddr string, err error) {
	for _, d := range []string{"home", "tls", "ssh", "gpg"} {
		if err := os.MkdirAll(filepath.Join(a.Work, d), 0o700); err != nil {
			return nil, "", err
		}
	}
	if grpcAddr, err = FreeAddr(); err != nil {
		return nil, "", err
	}
	metrics, err := FreeAddr()
	if err != nil {
		return nil, "", err
	}
	_, port, _ := net.SplitHostPort(grpcAddr)
	_, mport, _ := net.SplitHostPort(metrics)
	p, err = startTool(ctx, filepath.Join(a.Dir, "argocd"), metrics, []string{"repo-server",
		"--address=127.0.0.1", "--port=" + port, "--metrics-address=127.0.0.1", "--metrics-port=" + mport,
		"--redis=" + a.Redis, "--disable-tls", "--client-ca-path=", "--loglevel=info", "--logformat=text",
	}, a.environ(), out, "/healthz")
	return p, grpcAddr, err
}

// StartApplicationController runs Argo CD's application controller on the repo server at
// repoServer, reconciling every Application every resync.
func (a ArgoCD) StartApplicationController(ctx context.Context, repoServer string, resync time.Duration, out io.Writer) (*Tool, error) {
	metrics, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	_, mport, _ := net.SplitHostPort(metrics)
	return startTool(ctx, filepath.Join(a.Dir, "argocd"), metrics, []string{"application-controller",
		"--kubeconfig=" + a.KubeConfig, "--repo-server=" + repoServer, "--repo-server-plaintext",
		"--redis=" + a.Redis, "--metrics-port=" + mport, "--app-resync=" + fmt.Sprint(int(resync.Seconds())),
		"--status-processors=2", "--operation-processors=2", "--loglevel=info", "--logformat=text",
	}, a.environ(), out, "/healthz")
}

// CertManagerDir is the folder holding the real cert-manager (its controller and cainjector in
// one binary, cert-manager, and its CRDs in crds/) that hack/certmanager-binaries.sh builds:
// $EXIT_GUARD_CERT_MANAGER_BIN when set, else the script's cache folder. It fails with a
// message that says how to get it when it is missing.
func CertManagerDir() (string, error) {
	files := []string{"cert-manager", filepath.Join("crds", "cert-manager.io_certificates.yaml")}
	return cachedDir("EXIT_GUARD_CERT_MANAGER_BIN", "certmanager-binaries.sh", files, func(dir, f string) error {
		return fmt.Errorf("the certificate-renewal test needs a real cert-manager, and %s has no %s: run 'make e2e-certmanager' (it "+
			"builds cert-manager's controller and cainjector from Go modules, about 5 minutes the first time) or 'make certmanager-binaries'", dir, f)
	})
}
