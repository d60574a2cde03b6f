package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// BuildGuard builds the exit-guard binary into dir and returns its path.
func BuildGuard(dir string) (string, error) {
	bin := filepath.Join(dir, "exit-guard")
	cmd := exec.Command("go", "build", "-o", bin, ".") //nolint:gosec // G204: builds this repository into a temporary folder
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building exit-guard: %w: %s", err, out)
	}
	return bin, nil
}

// Guard is an exit-guard process.
type Guard struct {
	*Process
	// ProbeAddr and MetricsAddr are its health and metrics endpoints on loopback.
	ProbeAddr, MetricsAddr string
	dir                    string
}

// StartGuard runs bin with args against the API server that kubeconfig reaches, with its probe
// and metrics endpoints on free loopback ports (appended after args, so they win), and waits
// until /readyz answers 200. Its output goes to out.
func StartGuard(ctx context.Context, bin string, kubeconfig []byte, args []string, out io.Writer) (*Guard, error) {
	g, err := LaunchGuard(bin, kubeconfig, args, out)
	if err != nil {
		return nil, err
	}
	if err := g.WaitReady(ctx, 90*time.Second); err != nil {
		return nil, errors.Join(err, g.Stop())
	}
	return g, nil
}

// LaunchGuard is StartGuard without the wait.
func LaunchGuard(bin string, kubeconfig []byte, args []string, out io.Writer) (*Guard, error) {
	dir, err := os.MkdirTemp("", "exit-guard-run")
	if err != nil {
		return nil, err
	}
	g := &Guard{dir: dir}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	if g.ProbeAddr, err = FreeAddr(); err != nil {
		return nil, err
	}
	if g.MetricsAddr, err = FreeAddr(); err != nil {
		return nil, err
	}
	args = append(append([]string{}, args...),
		"--health-probe-bind-address="+g.ProbeAddr, "--metrics-bind-address="+g.MetricsAddr)
	if g.Process, err = Launch(bin, args, append(os.Environ(), "KUBECONFIG="+kc), out); err != nil {
		return nil, err
	}
	return g, nil
}

// WaitReady waits up to timeout for /readyz to answer 200; it fails at once when the process
// ends.
func (g *Guard) WaitReady(ctx context.Context, timeout time.Duration) error {
	_, err := g.Process.WaitReady(ctx, "http://"+g.ProbeAddr+"/readyz", 100*time.Millisecond, timeout)
	return err
}

// Probe GETs path on the probe endpoint and returns the status code.
func (g *Guard) Probe(ctx context.Context, path string) (int, error) {
	return Get(ctx, "http://"+g.ProbeAddr+path)
}

// Stop sends SIGTERM and waits for the process to end (killing it after 30 s). It returns the
// process's exit error, if any.
func (g *Guard) Stop() error {
	defer func() { _ = os.RemoveAll(g.dir) }()
	return g.Process.Stop(30 * time.Second)
}

// Kill ends the process at once (SIGKILL), as a crash or an OOM kill would, and waits for it.
// It does nothing to a process that has ended.
func (g *Guard) Kill() error {
	defer func() { _ = os.RemoveAll(g.dir) }()
	g.Process.Kill()
	return nil
}

// FreeAddr returns a loopback address with a port that was free a moment ago (on every
// interface), that it has not returned before in this process, and that no other process
// that uses it (another package's tests) holds: see reserve. The port lies below the
// kernel's ephemeral range where there is room for it: a port from that range, bound only later
// (a guard's webhook port, bound again by each test), can meanwhile become the local port of any
// outgoing connection on the machine, and the bind then fails for as long as that connection
// lives.
func FreeAddr() (string, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	low, high := fixedPortRange()
	for range 100 {
		var addr string
		if low < high {
			port := low + rand.IntN(high-low) //nolint:gosec // G404: a port to try, not a secret
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			if handedOut.ports[addr] {
				continue
			}
			l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
			if err != nil {
				continue
			}
			if err := l.Close(); err != nil {
				return "", err
			}
			// Test binaries of other packages run beside this one and draw from the same
			// range: each holds a lock on the ports it handed out, for as long as it lives.
			if held, err := reserve(port); err != nil {
				return "", err
			} else if !held {
				continue
			}
		} else {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return "", err
			}
			addr = l.Addr().String()
			if err := l.Close(); err != nil {
				return "", err
			}
		}
		// The kernel may hand a port just closed out again: two callers that have not bound
		// theirs yet (a guard's webhook and probe ports) would then collide.
		if !handedOut.ports[addr] {
			handedOut.ports[addr] = true
			return addr, nil
		}
	}
	return "", errors.New("no free port not handed out before, in 100 tries")
}

// fixedPortRange is the range [low, high) FreeAddr draws ports from: the 10,000 ports below
// the kernel's ephemeral range (net.ipv4.ip_local_port_range), none below 1025; empty where the
// range cannot be read (FreeAddr then asks the kernel for a port).
func fixedPortRange() (low, high int) {
	raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(raw))
	if len(f) != 2 {
		return 0, 0
	}
	ephemeralLow, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, 0
	}
	return max(1025, ephemeralLow-10000), ephemeralLow
}

// FreePort is the port of FreeAddr.
func FreePort() (int, error) {
	addr, err := FreeAddr()
	if err != nil {
		return 0, err
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(port)
}

// TestPort is FreePort for a test, which it fails when there is none.
func TestPort(t testing.TB) int {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// reserve takes an exclusive lock on a file named for port, shared by every process on the
// machine, and keeps it until this process ends (the kernel releases it then, however the
// process ends). It reports false when another process holds it.
func reserve(port int) (bool, error) {
	dir := filepath.Join(os.TempDir(), "exit-guard-test-ports")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return false, err
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o600) //nolint:gosec // G304: a file named for a port
	if err != nil {
		return false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil { //nolint:gosec // G115: a file descriptor fits an int
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("locking a port's file: %w", err)
	}
	handedOut.locks = append(handedOut.locks, f)
	return true, nil
}

// handedOut are the addresses FreeAddr returned, in this process, and the files whose locks
// reserve them.
var handedOut = struct {
	sync.Mutex
	ports map[string]bool
	locks []*os.File
}{ports: map[string]bool{}}

// GuardWebhook is the guard's ValidatingWebhookConfiguration as config/webhook generates it
// from the markers of the code's kinds (with their object selectors and match conditions). Give
// it to Options.ValidatingWebhooks: envtest points it at the local serving address.
func GuardWebhook() (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	vwc, _, err := GeneratedWebhooks()
	return vwc, err
}

// GeneratedWebhooks are the guard's webhook configurations as config/webhook generates them from
// the markers of the code's kinds: every kind's validating webhook, and the mutating webhooks of
// the kinds that mark.
func GeneratedWebhooks() (*admissionregistrationv1.ValidatingWebhookConfiguration, *admissionregistrationv1.MutatingWebhookConfiguration, error) {
	raw, err := os.ReadFile(filepath.Join(RepoRoot(), "config", "webhook", "manifests.yaml"))
	if err != nil {
		return nil, nil, err
	}
	var vwc *admissionregistrationv1.ValidatingWebhookConfiguration
	var mwc *admissionregistrationv1.MutatingWebhookConfiguration
	for _, doc := range strings.Split(string(raw), "\n---") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, nil, fmt.Errorf("config/webhook/manifests.yaml: %w", err)
		}
		switch meta.Kind {
		case "ValidatingWebhookConfiguration":
			vwc = &admissionregistrationv1.ValidatingWebhookConfiguration{}
			err = yaml.Unmarshal([]byte(doc), vwc)
		case "MutatingWebhookConfiguration":
			mwc = &admissionregistrationv1.MutatingWebhookConfiguration{}
			err = yaml.Unmarshal([]byte(doc), mwc)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("config/webhook/manifests.yaml: %w", err)
		}
	}
	if vwc == nil {
		return nil, nil, errors.New("config/webhook/manifests.yaml has no ValidatingWebhookConfiguration: run make manifests")
	}
	return vwc, mwc, nil
}

// ChartWebhook is the ValidatingWebhookConfiguration that the chart renders with its default
// values, and set (helm --set), (enforce mode: the pod, WorkflowTaskSet and Event webhooks,
// with the chart's selectors and match conditions), rendered by helm at helmBin. Give it to
// Options.ValidatingWebhooks: envtest points it at the local serving address.
func ChartWebhook(helmBin string, set ...string) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	args := []string{"template", "exit-guard", filepath.Join(RepoRoot(), "charts", "exit-guard"), "--namespace", "argo", "--kube-version", KubeVersion()}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helmBin, args...) //nolint:gosec // G204: the repository's pinned helm
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm template: %w: %s", err, stderr.String())
	}
	for _, doc := range strings.Split(string(out), "\n---") {
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		if err := yaml.Unmarshal([]byte(doc), &vwc); err != nil {
			return nil, fmt.Errorf("the chart's manifests: %w", err)
		}
		if vwc.Kind != "ValidatingWebhookConfiguration" {
			continue
		}
		for i := range vwc.Webhooks {
			vwc.Webhooks[i].ClientConfig.CABundle = nil // envtest sets its own
		}
		return &vwc, nil
	}
	return nil, errors.New("the chart rendered no ValidatingWebhookConfiguration")
}

// HelmBin is the helm the tests use: $HELM, or the one make builds into the user cache.
func HelmBin() (string, error) { return ToolBin("HELM", "helm-"+Version("HELM_VERSION")) }

// Helm3Bin returns the Helm 3 the tests keep beside the pinned Helm (HELM3_VERSION): $HELM3, or
// the one make builds into ToolsDir.
func Helm3Bin() (string, error) { return ToolBin("HELM3", "helm-"+Version("HELM3_VERSION")) }

// ToolBin returns a tool the tests run: $env, or the one make builds into ToolsDir as file.
func ToolBin(env, file string) (string, error) {
	bin := os.Getenv(env)
	if bin == "" {
		bin = filepath.Join(ToolsDir(), file)
	}
	if _, err := os.Stat(bin); err != nil { //nolint:gosec // G703: $env or the tools folder, chosen by whoever runs the tests
		return "", fmt.Errorf("no %s at %s: run the tests through make, which builds it from Go modules (or set %s)", file, bin, env)
	}
	return bin, nil
}

// ToolsDir is where make builds the pinned tools (helm, promtool, ...): tools/ under
// $EXIT_GUARD_CACHE, by default ${XDG_CACHE_HOME:-~/.cache}/exit-guard, as hack/ keeps the API
// server's binaries.
func ToolsDir() string {
	root := os.Getenv("EXIT_GUARD_CACHE")
	if root == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			cache = filepath.Join(os.Getenv("HOME"), ".cache")
		}
		root = filepath.Join(cache, "exit-guard")
	}
	return filepath.Join(root, "tools")
}
