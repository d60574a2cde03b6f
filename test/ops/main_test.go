//go:build e2e

// Package ops runs the chart's alerts on the real tools a team runs: the rendered rules in a
// real Prometheus that scrapes the guard (labelled as the chart's ServiceMonitor would) and the
// API server, and a real Alertmanager that delivers them to a local receiver. Each alert is
// brought about by its real cause, seen delivered with its annotations rendered, and resolved.
// make e2e-ops builds Prometheus and Alertmanager from Go modules (hack/ops-binaries.sh).
package ops

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

const (
	// namespace is the guard's release namespace: the rules select its series by it.
	namespace = "argo"
	// adminUser is the test API server's administrator, who stands in for Argo's controller.
	adminUser = "admin"
)

// shortDurations are the chart values the suite renders its rules with: the alerts' waits and
// windows cut from minutes to seconds, so that each can fire and resolve within the run.
var shortDurations = []string{
	"prometheusRule.notReadyFor=10s", "prometheusRule.failingOpenFor=10s", "prometheusRule.rejectingFor=10s",
	"prometheusRule.liveReadsFailingFor=10s", "prometheusRule.watchStalledFor=5s",
	"prometheusRule.apiServerMetricsMissingFor=10s", "prometheusRule.rateWindow=20s",
	"prometheusRule.countWindow=20s", "prometheusRule.deniedWindow=20s",
	// Not exercised yet: kept out of the negative control's way.
	"prometheusRule.neverCalledAfterCompletions=100000",
}

var (
	env      *testenv.Env
	guardBin string
	helmBin  string
	opsDir   string
	work     string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	// The test's own clients log nothing.
	ctrllog.SetLogger(logr.Discard())
	var err error
	if work, err = os.MkdirTemp("", "exit-guard-ops"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(work) }()
	if opsDir, err = testenv.OpsDir(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	if guardBin, err = testenv.BuildGuard(work); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	if helmBin, err = testenv.HelmBin(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	// The chart's webhooks as rendered (failurePolicy Ignore: the API server fails open while
	// the guard is away, which ExitGuardWebhookFailingOpen must say).
	vwc, err := testenv.ChartWebhook(helmBin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	return testenv.Main(m, testenv.Options{ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{vwc}}, &env)
}

// service is what a Service in front of the guard's metrics port is to Prometheus: a fixed
// address, forwarding each connection (plain or TLS, as the guard serves it) to the guard of the
// moment, or closing it while there is none.
type service struct {
	addr    string
	mu      sync.Mutex
	backend string
}

func startService(t *testing.T) *service {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &service{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.forward(c)
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return s
}

func (s *service) forward(c net.Conn) {
	defer func() { _ = c.Close() }()
	s.mu.Lock()
	b := s.backend
	s.mu.Unlock()
	if b == "" {
		return
	}
	up, err := net.DialTimeout("tcp", b, time.Second)
	if err != nil {
		return
	}
	defer func() { _ = up.Close() }()
	testenv.Splice(c, up)
}

// route sends the service's connections to the guard whose metrics listen on addr ("" for
// none).
func (s *service) route(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backend = addr
}

// stack is a running Prometheus and Alertmanager, and the receiver Alertmanager delivers to.
type stack struct {
	prom, am *testenv.Tool
	recv     *testenv.Receiver
	svc      *service
	current  *testenv.Guard // the guard running, if any
	config   string         // Prometheus's configuration file
}

// startStack renders the chart's rules (release exit-guard in namespace, shortDurations and
// set), and starts a receiver, an Alertmanager that delivers every alert to it at once, and a
// Prometheus that evaluates the rules every second on its scrapes of the guard's service and of
// the API server.
func startStack(t *testing.T, set ...string) *stack {
	t.Helper()
	return startStackWith(t, true, set...)
}

// startStackWith is startStack; without scrapeAPIServer, Prometheus scrapes the guard alone.
func startStackWith(t *testing.T, scrapeAPIServer bool, set ...string) *stack {
	t.Helper()
	return startStackScraping(t, scrapeAPIServer, nil, set...)
}

// startStackScraping is startStackWith, guardScrape (given the service's address) the settings
// of the guard's scrape job (YAML lines of a scrape_config, indented four spaces: scheme,
// tls_config, authorization) and any further jobs after it.
func startStackScraping(t *testing.T, scrapeAPIServer bool, guardScrape func(service string) string, set ...string) *stack {
	t.Helper()
	dir := t.TempDir()
	out := &testenv.Output{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Prometheus and Alertmanager said:\n%s", out)
		}
	})
	st := &stack{svc: startService(t)}
	t.Cleanup(func() {
		if st.current != nil {
			_ = st.current.Stop()
		}
	})
	var err error
	if st.recv, err = testenv.StartReceiver(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.recv.Close() })

	amConfig := fmt.Sprintf(`route:
  receiver: test
  group_by: ['...']
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: test
    webhook_configs:
      - url: %s
        send_resolved: true
`, st.recv.URL)
	write(t, filepath.Join(dir, "alertmanager.yaml"), amConfig)
	if st.am, err = testenv.StartAlertmanager(t.Context(), opsDir, dir, filepath.Join(dir, "alertmanager.yaml"), out); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { _ = st.am.Stop() })

	write(t, filepath.Join(dir, "rules.yaml"), renderRules(t, set...))
	// The API server's metrics, as the administrator (its client certificate).
	write(t, filepath.Join(dir, "apiserver-ca.crt"), string(env.Config.CAData))
	write(t, filepath.Join(dir, "admin.crt"), string(env.Config.CertData))
	write(t, filepath.Join(dir, "admin.key"), string(env.Config.KeyData))
	api, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	promConfig := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
alerting:
  alertmanagers:
    - static_configs:
        - targets: [%q]
rule_files: [rules.yaml]
scrape_configs:
  # As the chart's ServiceMonitor has the Prometheus Operator label the guard's series.
  - job_name: exit-guard-metrics
    static_configs:
      - targets: [%q]
        labels: {namespace: %q, pod: exit-guard-a, service: exit-guard-metrics, endpoint: metrics, container: exit-guard}
`, st.am.Addr, st.svc.addr, namespace)
	if guardScrape != nil {
		promConfig += guardScrape(st.svc.addr)
	}
	apiJob := fmt.Sprintf(`  - job_name: apiserver
    scheme: https
    tls_config:
      ca_file: %s
      cert_file: %s
      key_file: %s
    static_configs:
      - targets: [%q]
`, filepath.Join(dir, "apiserver-ca.crt"), filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key"), api.Host)
	st.config = filepath.Join(dir, "prometheus.yaml")
	if scrapeAPIServer {
		promConfig += apiJob
	} else {
		// For a test to put the API server's job back (POST /-/reload).
		write(t, st.config+".with-apiserver", promConfig+apiJob)
	}
	write(t, st.config, promConfig)
	if st.prom, err = testenv.StartPrometheus(t.Context(), opsDir, dir, st.config, out); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { _ = st.prom.Stop() })
	return st
}

// renderRules is the spec of the chart's PrometheusRule, as a Prometheus rule file.
func renderRules(t *testing.T, set ...string) string {
	t.Helper()
	args := []string{"template", "exit-guard", filepath.Join(testenv.RepoRoot(), "charts", "exit-guard"), "--namespace", namespace,
		"--kube-version", testenv.KubeVersion(), "--show-only", "templates/prometheusrule.yaml", "--set", "prometheusRule.enabled=true"}
	for _, s := range append(append([]string{}, shortDurations...), set...) {
		args = append(args, "--set", s)
	}
	out, err := runTool(helmBin, args...)
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec any `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &rule); err != nil {
		t.Fatal(err)
	}
	raw, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitNotified waits up to limit for Alertmanager to deliver alertname with status after
// since, every label of labels matching, and returns it with the time it took.
func (st *stack) waitNotified(t *testing.T, alertname, status string, since time.Time, limit time.Duration, labels map[string]string) (testenv.Notification, time.Duration) {
	t.Helper()
	var found testenv.Notification
	_ = wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, limit, true, func(context.Context) (bool, error) {
		for _, n := range st.recv.Notifications() {
			if n.Labels["alertname"] != alertname || n.Status != status || n.Received.Before(since) {
				continue
			}
			ok := true
			for k, v := range labels {
				ok = ok && n.Labels[k] == v
			}
			if ok {
				found = n
				return true, nil
			}
		}
		return false, nil
	})
	if found.Status != "" {
		return found, found.Received.Sub(since)
	}
	var seen []string
	for _, n := range st.recv.Notifications() {
		seen = append(seen, n.Labels["alertname"]+"/"+n.Status)
	}
	pending, _ := testenv.Query(context.Background(), st.prom.Addr, `ALERTS{alertname="`+alertname+`"}`)
	t.Fatalf("no %s notification of %s within %s (delivered so far: %s; ALERTS now: %v)", status, alertname, limit, strings.Join(seen, ", "), pending)
	return testenv.Notification{}, 0
}

// runTool runs bin with args and returns its standard output.
func runTool(bin string, args ...string) ([]byte, error) {
	cmd := exec.Command(bin, args...) //nolint:gosec // G204: the repository's pinned tools
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}
