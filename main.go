// Command exit-guard runs the exit-guard admission webhook beside Argo Workflows: it watches
// Workflows, remembers which ones completed, and refuses exit-handler pods that a stale copy
// of a completed workflow tries to create.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/internal/certs"
	"github.com/exit-guard/exit-guard/internal/check"
	"github.com/exit-guard/exit-guard/internal/metricsauth"
	"github.com/exit-guard/exit-guard/internal/shutdown"
	"github.com/exit-guard/exit-guard/webhook"
)

// flags holds the command line.
type flags struct {
	metricsAddr      string
	metricsSecure    bool
	probeAddr        string
	pprofAddr        string
	webhookPort      int
	webhookCertPath  string
	webhookCertName  string
	webhookKeyName   string
	enableHTTP2      bool
	gracefulShutdown time.Duration
	shutdownDelay    time.Duration
	zap              zap.Options
	restartOnFailure bool

	mode            string
	denyPhases      string
	hooks           bool
	strict          bool
	storeFirst      bool
	liveReadTimeout time.Duration
	liveReadBudget  time.Duration
	storeFallback   string
	namespaces      string
	completionTTL   time.Duration
	sweepInterval   time.Duration

	certMode           string
	certSecret         string
	certNamespace      string
	certDNSName        string
	certExtraDNSNames  string
	validatingConfig   string
	mutatingConfig     string
	serverCertDuration time.Duration
	certLookahead      time.Duration
	certCheckFrequency time.Duration
}

// certOptions turns the command line into the options of self-managed certificates; nil when
// the certificate comes from outside (cert-manager, the chart, a file).
func (f *flags) certOptions() (*certs.Options, error) {
	switch f.certMode {
	case "external":
		return nil, nil
	case "self":
	default:
		return nil, fmt.Errorf("unknown --cert-mode %q: want external or self", f.certMode)
	}
	o := &certs.Options{
		Secret:             types.NamespacedName{Namespace: f.certNamespace, Name: f.certSecret},
		CertDir:            f.webhookCertPath,
		DNSName:            f.certDNSName,
		ExtraDNSNames:      splitList(f.certExtraDNSNames),
		ServerCertDuration: f.serverCertDuration,
		Lookahead:          f.certLookahead,
		CheckFrequency:     f.certCheckFrequency,
	}
	if f.validatingConfig != "" {
		o.ValidatingWebhooks = []string{f.validatingConfig}
	}
	if f.mutatingConfig != "" {
		o.MutatingWebhooks = []string{f.mutatingConfig}
	}
	if o.CertDir == "" {
		return nil, errors.New("--cert-mode=self needs --webhook-cert-path, where the certificate Secret is mounted")
	}
	return o, nil
}

// guardOptions turns the command line into the options of the store and the webhook.
func (f *flags) guardOptions() (completionstore.Options, webhook.Options, error) {
	mode, err := webhook.ParseMode(f.mode)
	if err != nil {
		return completionstore.Options{}, webhook.Options{}, err
	}
	phases, err := webhook.ParsePhases(f.denyPhases)
	if err != nil {
		return completionstore.Options{}, webhook.Options{}, err
	}
	fallback, err := webhook.ParseStoreFallback(f.storeFallback)
	if err != nil {
		return completionstore.Options{}, webhook.Options{}, err
	}
	namespaces := splitList(f.namespaces)
	return completionstore.Options{TTL: f.completionTTL, SweepInterval: f.sweepInterval},
		webhook.Options{
			Mode:            mode,
			DenyPhases:      phases,
			Hooks:           f.hooks,
			Strict:          f.strict,
			StoreFirst:      f.storeFirst,
			LiveReadTimeout: f.liveReadTimeout,
			LiveReadBudget:  f.liveReadBudget,
			StoreFallback:   fallback,
			Namespaces:      namespaces,
		}, nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{zap: zap.Options{TimeEncoder: zapcore.ISO8601TimeEncoder}}
	fs := flag.NewFlagSet("exit-guard", flag.ContinueOnError)
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080",
		"The address the Prometheus metrics endpoint binds to; 0 disables it.")
	fs.BoolVar(&f.metricsSecure, "metrics-secure", false,
		"Serve metrics over HTTPS, only to clients the API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get on the /metrics URL).")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "The address the health probes bind to.")
	fs.StringVar(&f.pprofAddr, "pprof-bind-address", "0",
		"The address Go's profiling endpoints (/debug/pprof/) bind to; 0 disables them. Keep it on 127.0.0.1 and reach it with kubectl port-forward.")
	fs.IntVar(&f.webhookPort, "webhook-port", crwebhook.DefaultPort, "The port the admission webhook serves on.")
	fs.StringVar(&f.webhookCertPath, "webhook-cert-path", "",
		"The folder holding the webhook serving certificate; empty means controller-runtime's default.")
	fs.StringVar(&f.webhookCertName, "webhook-cert-name", "tls.crt", "The serving certificate's file name.")
	fs.StringVar(&f.webhookKeyName, "webhook-cert-key", "tls.key", "The serving key's file name.")
	fs.BoolVar(&f.enableHTTP2, "enable-http2", false,
		"Serve the webhook and metrics over HTTP/2 as well as HTTP/1.1 (off by default, see main.go).")
	// Below the chart's terminationGracePeriodSeconds (30 s), so that in-flight admission
	// requests finish before the kubelet kills the container.
	fs.DurationVar(&f.gracefulShutdown, "graceful-shutdown-timeout", 20*time.Second,
		"How long to wait for in-flight requests and runnables on shutdown.")
	// Endpoints and kube-proxy take a few seconds to drop a terminating pod; the chart's
	// terminationGracePeriodSeconds covers this delay and the graceful shutdown after it.
	fs.DurationVar(&f.shutdownDelay, "shutdown-delay", 10*time.Second,
		"How long to keep answering admissions after SIGTERM (unready, closing kept-alive connections) before stopping, so that the Service stops routing to this pod first.")
	fs.StringVar(&f.mode, "mode", string(webhook.ModeEnforce),
		"What to do with a pod the guard would refuse: enforce (deny), warn (admit with a warning, an Event and a mark) or dry-run (admit, log, count and mark).")
	fs.StringVar(&f.denyPhases, "deny-phases", "Succeeded",
		"Comma-separated terminal phases whose exit handlers are refused; add Failed,Error to stop duplicate failure notices.")
	fs.BoolVar(&f.hooks, "cover-hooks", false, "Also refuse pods of lifecycle hooks other than exit (.hooks. nodes) of completed workflows.")
	fs.BoolVar(&f.strict, "strict", false, "Refuse every pod a completed workflow owns, not only exit handlers.")
	fs.BoolVar(&f.storeFirst, "store-first", false,
		"Admit exit-handler pods from the store without a live read when it holds no completion (lower latency; a lagging watch then lets stale pods through).")
	fs.DurationVar(&f.liveReadTimeout, "live-read-timeout", time.Second,
		"How long one attempt of the live read of a pod's workflow may take before another starts beside it.")
	fs.DurationVar(&f.liveReadBudget, "live-read-budget", 4*time.Second,
		"How long the live read may take in all, retries included; past it the store decides. Keep it at least a second below the webhook's timeoutSeconds.")
	fs.StringVar(&f.storeFallback, "store-fallback", string(webhook.FallbackTombstone),
		"What the store alone may refuse when no live read answers within the budget: tombstone (only workflows seen deleted) or completion (also workflows seen completed; a workflow retried in that moment is then refused too).")
	fs.StringVar(&f.namespaces, "namespaces", "", "Comma-separated namespaces to watch and guard; empty means all.")
	fs.DurationVar(&f.completionTTL, "completion-ttl", 10*time.Minute, "How long the store remembers a workflow after its last change.")
	fs.DurationVar(&f.sweepInterval, "sweep-interval", 30*time.Second, "How often expired records are removed from the store.")
	fs.BoolVar(&f.restartOnFailure, "restart-on-failure", false,
		"When the guard fails (the API server, its certificate, a port), restart it in the process after a backoff instead of exiting; for the sidecar in Argo's controller pod, where a container that exits makes the pod NotReady.")
	fs.StringVar(&f.certMode, "cert-mode", "external",
		"Where the webhook certificate comes from: external (files in --webhook-cert-path, e.g. from cert-manager or the chart) or self (the guard creates and rotates it).")
	fs.StringVar(&f.certSecret, "cert-secret", "exit-guard-webhook-tls", "With --cert-mode=self: the Secret that holds the CA and serving certificate.")
	fs.StringVar(&f.certNamespace, "cert-namespace", os.Getenv("POD_NAMESPACE"), "With --cert-mode=self: the namespace of that Secret (default $POD_NAMESPACE).")
	fs.StringVar(&f.certDNSName, "cert-dns-name", "", "With --cert-mode=self: the webhook Service's DNS name, <service>.<namespace>.svc.")
	fs.StringVar(&f.certExtraDNSNames, "cert-extra-dns-names", "", "With --cert-mode=self: comma-separated further DNS names of the serving certificate.")
	fs.StringVar(&f.validatingConfig, "validating-webhook-configuration", "",
		"With --cert-mode=self: the ValidatingWebhookConfiguration to write the CA into.")
	fs.StringVar(&f.mutatingConfig, "mutating-webhook-configuration", "",
		"With --cert-mode=self: the MutatingWebhookConfiguration to write the CA into.")
	fs.DurationVar(&f.serverCertDuration, "server-cert-duration", 365*24*time.Hour, "With --cert-mode=self: how long a serving certificate is valid.")
	fs.DurationVar(&f.certLookahead, "cert-lookahead", 90*24*time.Hour, "With --cert-mode=self: how long before expiry certificates are renewed.")
	fs.DurationVar(&f.certCheckFrequency, "cert-check-frequency", 12*time.Hour, "With --cert-mode=self: how often expiry is checked.")
	f.zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return f, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "check" {
		os.Exit(runCheck(os.Args[2:]))
	}
	f, err := parseFlags(os.Args[1:])
	if err != nil {
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&f.zap)))
	setupLog := ctrl.Log.WithName("setup")
	if err := f.validate(); err != nil {
		setupLog.Error(err, "invalid flags")
		os.Exit(2)
	}
	started := time.Now()
	restartState := restartFromEnv()
	ctx := ctrl.SetupSignalHandler()
	drainer, err := shutdown.New(f.shutdownDelay, ctrl.Log.WithName("shutdown"))
	if err != nil {
		setupLog.Error(err, "invalid flags")
		os.Exit(2)
	}
	// Stops every run: ends a while after the signal, once the webhook has drained.
	runCtx := drainer.Run(ctx)

	// The probes outlive each run of the guard, so that a restart in the process (below) does
	// not fail the liveness probe; readiness is the current run's.
	probes := newProbes()
	if err := probes.serve(f.probeAddr, setupLog); err != nil {
		setupLog.Error(err, "unable to serve the health probes")
		os.Exit(1)
	}
	restarts := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "exit_guard_restarts_total",
		Help: "How many times the guard restarted in its process after a failure (--restart-on-failure).",
	})
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "exit_guard_ready",
		Help: "1 while every readiness check of the guard passes (the webhook serves, the Workflow watch has synced, not shutting down), else 0.",
	}, probes.readyValue)
	if err := errors.Join(metrics.Registry.Register(restarts), metrics.Registry.Register(ready)); err != nil {
		setupLog.Error(err, "unable to register the metrics")
		os.Exit(1)
	}

	restarts.Add(float64(restartState.count))
	err = run(runCtx, f, drainer, probes)
	probes.set(nil)
	if err == nil || ctx.Err() != nil {
		if err != nil {
			setupLog.Error(err, "stopped with an error")
		}
		return
	}
	if !f.restartOnFailure {
		setupLog.Error(err, "stopped with an error")
		os.Exit(1)
	}
	// In the pod of Argo's controller a container that exits makes the pod NotReady and,
	// exiting again, CrashLoopBackOff: the guard starts again in the same process instead (a
	// fresh image of it, by exec), and exit_guard_ready and exit_guard_restarts_total say that
	// it is not working. The probes keep answering during the backoff.
	next := restartState.next(time.Since(started))
	setupLog.Error(err, "stopped with an error: restarting", "in", next.backoff.String(), "restarts", next.count)
	select {
	case <-ctx.Done():
		return
	case <-time.After(next.backoff):
	}
	if err := next.exec(); err != nil {
		setupLog.Error(err, "unable to restart")
		os.Exit(1)
	}
}

// validate checks every flag that can be checked without the API server.
func (f *flags) validate() error {
	if _, _, err := f.guardOptions(); err != nil {
		return err
	}
	if _, err := f.certOptions(); err != nil {
		return err
	}
	return nil
}

// run runs the guard until ctx ends (nil) or it fails.
func run(ctx context.Context, f *flags, drainer *shutdown.Drainer, probes *probes) error {
	storeOpts, guardOpts, err := f.guardOptions()
	if err != nil {
		return err
	}
	certOpts, err := f.certOptions()
	if err != nil {
		return err
	}
	scheme, err := argo.NewScheme()
	if err != nil {
		return fmt.Errorf("building the scheme: %w", err)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("reaching the API server: %w", err)
	}
	wfObj, wfCache := completionstore.CacheByObject(guardOpts.Namespaces)

	// TLS 1.2 at least, on the webhook and the metrics endpoint, whatever Go's default.
	tlsOpts := []func(*tls.Config){func(c *tls.Config) { c.MinVersion = tls.VersionTLS12 }}
	if !f.enableHTTP2 {
		// HTTP/2 stays off unless asked for: the HTTP/2 Stream Cancellation and Rapid Reset
		// CVEs (GHSA-qppj-fm5r-hxr3, GHSA-4374-p667-p6c8) let a client exhaust the server.
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	webhookServer := crwebhook.NewServer(crwebhook.Options{
		Port:     f.webhookPort,
		CertDir:  f.webhookCertPath,
		CertName: f.webhookCertName,
		KeyName:  f.webhookKeyName,
		TLSOpts:  tlsOpts,
	})
	// The webhook serves once its certificate exists: a self-managed one is written by the
	// rotator after the start, and a mounted Secret may be empty (an optional volume whose
	// Secret is not there yet). Meanwhile the API server cannot reach it and fails open.
	certsReady := make(chan struct{})
	webhookServer = certs.WaitFor(webhookServer, certsReady)
	webhookServer = drainer.Server(webhookServer)

	metricsOpts := metricsserver.Options{BindAddress: f.metricsAddr, TLSOpts: tlsOpts}
	if f.metricsSecure {
		metricsOpts.SecureServing = true
		metricsOpts.FilterProvider = metricsauth.FilterProvider
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  "0", // served by probes, across runs
		PprofBindAddress:        f.pprofAddr,
		WebhookServer:           webhookServer,
		Cache:                   cache.Options{ByObject: map[client.Object]cache.ByObject{wfObj: wfCache}},
		GracefulShutdownTimeout: &f.gracefulShutdown,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}

	checks := map[string]healthz.Checker{}
	if certOpts != nil {
		certsChecker, err := certs.Setup(mgr, *certOpts, certsReady)
		if err != nil {
			return fmt.Errorf("managing the webhook certificate: %w", err)
		}
		checks["certificate"] = certsChecker
	} else {
		dir := f.webhookCertPath
		if dir == "" { // controller-runtime's default
			dir = filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs")
		}
		go waitForFiles(ctx, certsReady, ctrl.Log.WithName("setup"),
			filepath.Join(dir, f.webhookCertName), filepath.Join(dir, f.webhookKeyName))
	}

	store, err := completionstore.New(storeOpts)
	if err != nil {
		return fmt.Errorf("creating the completion store: %w", err)
	}
	synced, err := completionstore.Watch(ctx, mgr, store, completionstore.WatchOptions{})
	if err != nil {
		return err
	}
	if err := webhook.Setup(mgr, store, guardOpts); err != nil {
		return err
	}

	// Ready only once the webhook port serves with its certificate loaded, and the store has
	// every workflow of the initial list: before that it cannot tell completed from running.
	checks["webhook"] = mgr.GetWebhookServer().StartedChecker()
	checks["workflows-synced"] = synced
	checks["not-shutting-down"] = drainer.Ready()
	probes.set(checks)

	ctrl.Log.WithName("setup").Info("starting manager")
	return mgr.Start(ctx)
}

// runCheck is `exit-guard check`: it proves that the API server reaches the guard and that the
// guard refuses a stale exit-handler pod (internal/check), and returns the exit status.
func runCheck(args []string) int {
	fs := flag.NewFlagSet("exit-guard check", flag.ContinueOnError)
	namespace := fs.String("namespace", os.Getenv("POD_NAMESPACE"),
		"The namespace to send the dry-run exit-handler pod to: one the guard watches (default $POD_NAMESPACE).")
	image := fs.String("image", "pause", "The image of the dry-run pod (never pulled; image policies may look at it).")
	timeout := fs.Duration("timeout", 30*time.Second, "How long the check may take.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "exit-guard check: FAIL:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	res, err := check.Run(ctx, cfg, check.Options{Namespace: *namespace, Image: *image})
	if err != nil {
		fmt.Fprintln(os.Stderr, "exit-guard check: FAIL:", err)
		return 1
	}
	fmt.Printf("exit-guard check: OK: the API server called the guard, which %s the dry-run exit-handler pod %s/%s of the workflow %s, which does not exist.\n%s\n",
		res.Verdict, *namespace, res.Pod, res.Workflow, res.Message)
	return 0
}
