package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// process is a watcher under measurement: the exit-guard binary, or this tool's own watcher of
// whole objects (runWatcher) in a child process, so that its memory and CPU are its own.
type process struct {
	*testenv.Process
	name      string
	probeAddr string // serves /readyz
	// metricsAddr serves the guard's metrics.
	metricsAddr string
	// rv reads how far its watch has got (a resourceVersion).
	rv  func(ctx context.Context) (uint64, error)
	out *testenv.Output
	dir string
}

// shapes of watcher measured beside the guard.
const (
	// shapeFull: a plain informer of whole objects (unstructured), as most controllers run.
	shapeFull = "full-object"
	// shapePhase: whole objects on the wire, decoded into a type that keeps metadata and
	// status.phase and stripped by a transform: the guard's own watch before it read metadata
	// only.
	shapePhase = "full-stream-typed"
)

// startGuard runs the exit-guard binary against env's API server, serving its webhook on port
// with env's serving certificate.
func startGuard(bin string, env *testenv.Env, port int, args ...string) (*process, error) {
	p, err := newProcess("exit-guard", env.KubeConfig())
	if err != nil {
		return nil, err
	}
	metricsAddr, err := testenv.FreeAddr()
	if err != nil {
		return nil, err
	}
	p.metricsAddr = metricsAddr
	args = append([]string{"--webhook-port=" + strconv.Itoa(port), "--webhook-cert-path=" + env.WebhookCertDir,
		"--health-probe-bind-address=" + p.probeAddr, "--metrics-bind-address=" + metricsAddr}, args...)
	p.rv = func(ctx context.Context) (uint64, error) {
		v, err := scrape(ctx, "http://"+metricsAddr+"/metrics", "exit_guard_watch_resource_version")
		return uint64(v), err
	}
	return p, p.start(bin, args...)
}

// startLiveGet runs the live-GET peer webhook (runLiveGet) in a child process on port.
func startLiveGet(env *testenv.Env, port int) (*process, error) {
	p, err := newProcess("live-GET peer", env.KubeConfig())
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return p, p.start(self, liveGetCommand, "--addr="+net.JoinHostPort(env.WebhookHost, strconv.Itoa(port)),
		"--cert-dir="+env.WebhookCertDir, "--probe="+p.probeAddr)
}

// startWatcher runs this tool's watcher of the given shape in a child process.
func startWatcher(shape string, kubeconfig []byte) (*process, error) {
	p, err := newProcess(shape, kubeconfig)
	if err != nil {
		return nil, err
	}
	p.rv = func(ctx context.Context) (uint64, error) {
		body, err := get(ctx, "http://"+p.probeAddr+"/rv")
		if err != nil {
			return 0, err
		}
		return strconv.ParseUint(strings.TrimSpace(body), 10, 64)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return p, p.start(self, watcherCommand, "--shape="+shape, "--probe="+p.probeAddr)
}

func newProcess(name string, kubeconfig []byte) (*process, error) {
	dir, err := os.MkdirTemp("", "exit-guard-load")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "kubeconfig"), kubeconfig, 0o600); err != nil {
		return nil, err
	}
	addr, err := testenv.FreeAddr()
	if err != nil {
		return nil, err
	}
	return &process{name: name, probeAddr: addr, out: &testenv.Output{}, dir: dir}, nil
}

func (p *process) start(bin string, args ...string) (err error) {
	p.Process, err = testenv.Launch(bin, args, append(os.Environ(), "KUBECONFIG="+filepath.Join(p.dir, "kubeconfig")), p.out)
	return err
}

// waitReady polls /readyz every 10 ms and returns how long after the start it first passed.
func (p *process) waitReady(ctx context.Context) (time.Duration, error) {
	for {
		select {
		case <-p.Done():
			return 0, fmt.Errorf("%s was never ready: %w\n%s", p.name, p.Exited(), p.out)
		case <-ctx.Done():
			return 0, fmt.Errorf("%s never became ready: %w", p.name, errTimeout)
		default:
		}
		if _, err := get(ctx, "http://"+p.probeAddr+"/readyz"); err == nil {
			return time.Since(p.Started()), nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitRV waits until the process's watch has reached rv, asking every 20 ms.
func (p *process) waitRV(ctx context.Context, rv uint64) error {
	_, err := p.waitRVEvery(ctx, rv, 20*time.Millisecond)
	return err
}

// waitRVEvery waits until the process's watch has reached rv, asking every interval, and
// returns how many times it asked.
func (p *process) waitRVEvery(ctx context.Context, rv uint64, interval time.Duration) (int, error) {
	for asked := 1; ; asked++ {
		got, err := p.rv(ctx)
		if err == nil && got >= rv {
			return asked, nil
		}
		select {
		case <-p.Done():
			return asked, fmt.Errorf("%w\n%s", p.Exited(), p.out)
		case <-ctx.Done():
			return asked, fmt.Errorf("%s's watch never reached resourceVersion %d (at %d, %w): %w", p.name, rv, got, err, errTimeout)
		case <-time.After(interval):
		}
	}
}

// memory is what /proc says of the process's resident memory: now, and its peak (VmHWM).
type memory struct{ rss, peak int64 }

func (p *process) memory() (memory, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return memory{}, err
	}
	var m memory
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			m.rss = kb << 10
		case "VmHWM:":
			m.peak = kb << 10
		}
	}
	return m, nil
}

func (p *process) stop() {
	if p.Process != nil {
		_ = p.Stop(30 * time.Second)
	}
	_ = os.RemoveAll(p.dir)
}

func get(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(body), nil
}

// scrape reads the value of an unlabelled gauge or counter from a Prometheus endpoint.
func scrape(ctx context.Context, url, name string) (float64, error) {
	body, err := get(ctx, url)
	if err != nil {
		return 0, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	mf, ok := mfs[name]
	if !ok || len(mf.GetMetric()) == 0 {
		return 0, errors.New(name + " not served")
	}
	m := mf.GetMetric()[0]
	if m.GetGauge() != nil {
		return m.GetGauge().GetValue(), nil
	}
	return m.GetCounter().GetValue(), nil
}

// startChild parses the flags of a child process (a watcher, a peer webhook, a floor) and
// returns the context it runs in, which SIGTERM and SIGINT end.
func startChild(fs *flag.FlagSet, args []string) (context.Context, context.CancelFunc, error) {
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	return ctx, stop, nil
}

// unthrottledConfig is the config of the API server a child's KUBECONFIG names, without
// client-side rate limits.
func unthrottledConfig() (*rest.Config, error) {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = -1, 0
	return cfg, nil
}
