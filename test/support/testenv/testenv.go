// Package testenv starts a real kube-apiserver and etcd (controller-runtime's envtest) for the
// tests of exit-guard, on binaries that hack/envtest-binaries.sh builds from Go modules.
//
// One API server serves one test package: start it from TestMain with Start and stop it with
// Env.Stop. The Argo Workflow CRD of test/crds is installed; webhook configurations given in
// Options are registered against a local serving address whose certificates Env holds.
package testenv

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// Options configures the test API server.
type Options struct {
	// ValidatingWebhooks are registered with the API server, their client configs pointed at
	// the local serving address (a Service reference is replaced by a URL with its path).
	ValidatingWebhooks []*admissionregistrationv1.ValidatingWebhookConfiguration
	// MutatingWebhooks are registered the same way.
	MutatingWebhooks []*admissionregistrationv1.MutatingWebhookConfiguration
	// CRDDirs are folders of further CRDs to install, besides test/crds.
	CRDDirs []string
	// OwnCRDs installs only CRDDirs, not the project's Workflow CRD of test/crds (for Argo's
	// own CRDs).
	OwnCRDs bool
	// APIServerFlags are extra kube-apiserver flags, as name=value.
	APIServerFlags map[string]string
	// APIServerAddress is the address kube-apiserver serves on (default 127.0.0.1).
	APIServerAddress string
	// APIServerPort is the port kube-apiserver serves on (default: a free one).
	APIServerPort int
	// APIServerOutput receives kube-apiserver's output (none when nil).
	APIServerOutput io.Writer
}

// Env is a running API server.
type Env struct {
	env     *envtest.Environment
	certDir string
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is an uncached client on Config that knows the built-in types and argo.Workflow.
	Client client.Client
	// Scheme is the scheme of Client.
	Scheme *k8sruntime.Scheme
	// WebhookHost, WebhookPort and WebhookCertDir are where the registered webhooks expect
	// their server, and its serving certificate (tls.crt, tls.key).
	WebhookHost    string
	WebhookPort    int
	WebhookCertDir string
	// WebhookCAData is the CA that signed the serving certificate, as in the caBundles.
	WebhookCAData []byte
}

// RepoRoot is the top folder of this repository.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// AssetsDir returns the folder holding kube-apiserver and etcd: KUBEBUILDER_ASSETS when set,
// else the cache folder that hack/envtest-binaries.sh builds into. It fails with a message that
// says how to get the binaries when they are missing.
func AssetsDir() (string, error) {
	return cachedDir("KUBEBUILDER_ASSETS", "envtest-binaries.sh", []string{"kube-apiserver", "etcd"}, func(dir, bin string) error {
		return fmt.Errorf("the tests need a real kube-apiserver and etcd, and %s has no %s: "+
			"run 'make envtest-binaries' (it builds them from Go modules, about 10 minutes the first time) "+
			"or 'make test', which does it for you", dir, bin)
	})
}

// KubectlBin returns the kubectl of the API server's version, which hack/envtest-binaries.sh
// ensure-kubectl builds beside it: the tests that run the docs' kubectl recipes use it.
func KubectlBin() (string, error) {
	dir, err := cachedDir("KUBEBUILDER_ASSETS", "envtest-binaries.sh", []string{"kubectl"}, func(dir, bin string) error {
		return fmt.Errorf("the docs' kubectl recipes run a real kubectl, and %s has no %s: "+
			"run 'hack/envtest-binaries.sh ensure-kubectl' (it builds it from Go modules, a minute or two) "+
			"or 'make test', which does it for you", dir, bin)
	})
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "kubectl"), nil
}

// cachedDir is the folder of the binaries a script of hack/ builds into the user cache: $env
// when set, else what `hack/<script> path` prints. Each of files must be in it, else missing
// says how to get it.
func cachedDir(env, script string, files []string, missing func(dir, file string) error) (string, error) {
	dir := os.Getenv(env)
	if dir == "" {
		path := filepath.Join(RepoRoot(), "hack", script)
		out, err := exec.Command(path, "path").Output() //nolint:gosec // G204: the repository's own script
		if err != nil {
			return "", fmt.Errorf("finding the binaries of %s: %w", path, err)
		}
		dir = strings.TrimSpace(string(out))
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil { //nolint:gosec // G703: a test-support path chosen by the developer
			return "", missing(dir, f)
		}
	}
	return dir, nil
}

// Start starts etcd and kube-apiserver, installs the Workflow CRD and registers the webhooks of
// opts. Call Stop when done.
func Start(opts Options) (*Env, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	crdDirs := append([]string{filepath.Join(RepoRoot(), "test", "crds")}, opts.CRDDirs...)
	if opts.OwnCRDs {
		crdDirs = opts.CRDDirs
	}
	// The webhook's port is bound again by each guard a test starts, and the API server's by
	// each restart: both from FreeAddr's range, which no outgoing connection takes meanwhile.
	webhookPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	apiPort := opts.APIServerPort
	if apiPort == 0 {
		if apiPort, err = FreePort(); err != nil {
			return nil, err
		}
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			ValidatingWebhooks: opts.ValidatingWebhooks,
			MutatingWebhooks:   opts.MutatingWebhooks,
			LocalServingHost:   "127.0.0.1",
			LocalServingPort:   webhookPort,
		},
		// A cold 2-core machine running tests in parallel packages can take longer than
		// envtest's 20 s default to bring up etcd and the API server.
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	api := te.ControlPlane.GetAPIServer()
	// Its secure serving address (the fields of the embedded SecureServing).
	api.Address, api.Port = cmp.Or(opts.APIServerAddress, "127.0.0.1"), strconv.Itoa(apiPort)
	if opts.APIServerOutput != nil {
		api.Out, api.Err = opts.APIServerOutput, opts.APIServerOutput
	}
	for k, v := range opts.APIServerFlags {
		api.Configure().Set(k, v)
	}
	// A folder of our own for the API server's certificates, so that a restart keeps them
	// (envtest makes new ones in a new folder otherwise) and clients still trust it.
	certDir, err := os.MkdirTemp("", "exit-guard-apiserver")
	if err != nil {
		return nil, err
	}
	api.CertDir = certDir
	cfg, err := te.Start()
	if err != nil {
		_ = os.RemoveAll(certDir)
		return nil, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", assets, err)
	}
	scheme, err := argo.NewScheme()
	if err != nil {
		return nil, errors.Join(err, te.Stop())
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, errors.Join(err, te.Stop())
	}
	wio := te.WebhookInstallOptions
	return &Env{
		env:            te,
		certDir:        certDir,
		Config:         cfg,
		Client:         c,
		Scheme:         scheme,
		WebhookHost:    wio.LocalServingHost,
		WebhookPort:    wio.LocalServingPort,
		WebhookCertDir: wio.LocalServingCertDir,
		WebhookCAData:  wio.LocalServingCAData,
	}, nil
}

// EtcdDataDir is the folder of etcd's data (its WAL and database): what a run writes to disk.
func (e *Env) EtcdDataDir() string {
	if e.env.ControlPlane.Etcd == nil {
		return ""
	}
	return e.env.ControlPlane.Etcd.DataDir
}

// KubeConfig returns a kubeconfig file's contents for an administrator of the API server.
func (e *Env) KubeConfig() []byte {
	return e.env.KubeConfig
}

// AddUser creates a user with the given name and groups and returns a config that
// authenticates as that user (client certificates), for RBAC tests.
func (e *Env) AddUser(name string, groups ...string) (*rest.Config, error) {
	u, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, e.Config)
	if err != nil {
		return nil, err
	}
	return u.Config(), nil
}

// KubeConfigAs is a kubeconfig file's contents, and the config, of a new user name in groups
// (client certificates): a process of its own (Argo's controller) that the API server's audit
// log tells apart.
func (e *Env) KubeConfigAs(name string, groups ...string) ([]byte, *rest.Config, error) {
	cfg, err := e.AddUser(name, groups...)
	if err != nil {
		return nil, nil, err
	}
	out, err := kubeConfig(&clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData},
		&clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData})
	return out, cfg, err
}

// kubeConfig is a kubeconfig file's contents with one context: cluster and user.
func kubeConfig(cluster *clientcmdapi.Cluster, user *clientcmdapi.AuthInfo) ([]byte, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"], kc.AuthInfos["test"] = cluster, user
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	return clientcmd.Write(*kc)
}

// ClientAs is an uncached client of Scheme that authenticates as a new user name in groups.
func (e *Env) ClientAs(t testing.TB, name string, groups ...string) client.Client {
	t.Helper()
	cfg, err := e.AddUser(name, groups...)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Stop stops the API server and etcd and removes their data.
func (e *Env) Stop() error {
	defer func() { _ = os.RemoveAll(e.certDir) }()
	return e.env.Stop()
}

// StopAPIServer stops kube-apiserver (etcd keeps running); StartAPIServer starts it again on
// the same address, with the same certificates and data.
func (e *Env) StopAPIServer() error {
	return e.env.ControlPlane.GetAPIServer().Stop()
}

// StartAPIServer starts kube-apiserver again after StopAPIServer.
func (e *Env) StartAPIServer() error {
	return e.env.ControlPlane.GetAPIServer().Start()
}

// Main is the body of a TestMain that needs an API server: it starts one, runs the tests with
// it in *env, stops it, and returns the exit code. A failure to start is reported as a failure,
// never as a skip.
func Main(m interface{ Run() int }, opts Options, env **Env) int {
	e, err := Start(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the test API server: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
