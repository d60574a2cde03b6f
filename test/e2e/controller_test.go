//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// controller returns the cached workflow-controller of version and its CRD folder.
func controller(t *testing.T, version string) (bin, crds string) {
	t.Helper()
	out, err := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "argo-controllers.sh"), "path").Output()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), version)
	bin, crds = filepath.Join(dir, "workflow-controller"), filepath.Join(dir, "crds")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no workflow-controller %s at %s: run 'make e2e-argo' (it builds the controllers from Go modules)", version, bin)
	}
	return bin, crds
}

// executorImage is the executor image a default install of bin's release names (never pulled:
// no kubelet runs here), from the version folder hack/argo-controllers.sh keeps it in. The
// guard reads the release from it (exit_guard_argo_exposure).
func executorImage(bin string) string {
	return "quay.io/argoproj/argoexec:" + filepath.Base(filepath.Dir(bin))
}

// controllerGrace is how long a controller told to stop (SIGTERM) has before it is killed.
const controllerGrace = 20 * time.Second

// launchController starts the workflow-controller bin on the test's namespace alone, reaching
// the API server through the kubeconfig file and logging at level into out, with args added to
// its flags. Its environment is the test's, without leader election (unless env turns it on:
// leaderElection) and with a requeue of 1 s, then env.
func launchController(t *testing.T, bin, kubeconfig, level string, args, env []string, out io.Writer) *testenv.Process {
	t.Helper()
	p, err := testenv.Launch(bin, append([]string{"--kubeconfig=" + kubeconfig, "--namespaced", "--managed-namespace=" + namespace,
		"--namespace=" + namespace, "--executor-image=" + executorImage(bin), "--loglevel=" + level}, args...),
		append(append(os.Environ(), "LEADER_ELECTION_DISABLE=true", "DEFAULT_REQUEUE_TIME=1s"), env...), out)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// scrapeController reads the workflow-controller's metrics endpoint (its default, port 9090,
// path /metrics; TLS with a self-signed certificate, or plain HTTP, as its version serves it).
func scrapeController(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // G402: the test's own controller on loopback, self-signed
	var lastErr error
	for _, scheme := range []string{"https", "http"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://127.0.0.1:9090/metrics", nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode != http.StatusOK {
			lastErr = fmt.Errorf("GET /metrics: %s", resp.Status)
			continue
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		return parser.TextToMetricFamilies(resp.Body)
	}
	return nil, lastErr
}

// waitControllerMetrics waits until the controller's metrics endpoint answers.
func waitControllerMetrics(ctx context.Context) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = scrapeController(ctx)
		return last == nil, nil
	})
	if err != nil {
		return errors.Join(err, last)
	}
	return nil
}

// leaderElection is the environment of a controller that takes part in leader election (the
// Lease workflow-controller in the test's namespace) as identity, with a lease of 4 s, renewed
// within 3 s, tried every second (upstream: 15, 10 and 5 s), so that a standby takes over a
// few seconds after the leader stops.
func leaderElection(identity string) []string {
	return []string{"LEADER_ELECTION_DISABLE=false", "LEADER_ELECTION_IDENTITY=" + identity,
		"LEADER_ELECTION_LEASE_DURATION=4s", "LEADER_ELECTION_RENEW_DEADLINE=3s", "LEADER_ELECTION_RETRY_PERIOD=1s"}
}
