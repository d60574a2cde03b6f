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
	"log"
	"os"
	"path/filepath"

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
	"github.com/exit-guard/exit-guard/internal/clientauth"
	"github.com/exit-guard/exit-guard/internal/lockwatch"
	"github.com/exit-guard/exit-guard/internal/metricsauth"
	"github.com/exit-guard/exit-guard/internal/shutdown"
	"github.com/exit-guard/exit-guard/webhook"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "check" {
		os.Exit(runCheck(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "affected" {
		os.Exit(runAffected(os.Args[2:], os.Stdout))
	}
	f, err := parseFlags(os.Args[1:])
	if err != nil {
		os.Exit(usageExit(err))
	}
	if f.version {
		fmt.Println(versionLine())
		return
	}
	ctrl.SetLogger(newLogger(zap.New(zap.UseFlagOptions(&f.zap))))
	setupLog := ctrl.Log.WithName("setup")
	v, c, d := buildVersion()
	setupLog.Info("exit-guard starting", "version", v, "commit", c, "built", d)
	if limit, ok, err := setMemoryLimit(); err != nil {
		setupLog.Error(err, "invalid environment")
		os.Exit(2)
	} else if ok {
		setupLog.Info("Go memory limit set from the container's", "bytes", limit, "share", memoryLimitShare)
	}
	opts, err := f.options()
	if err != nil {
		setupLog.Error(err, "invalid flags")
		os.Exit(2)
	}
	ctx := ctrl.SetupSignalHandler()
	drainer, err := shutdown.New(f.serve.shutdownDelay, ctrl.Log.WithName("shutdown"))
	if err != nil {
		setupLog.Error(err, "invalid flags")
		os.Exit(2)
	}
	// Stops every run: ends a while after the signal, once the webhook has drained.
	runCtx := drainer.Run(ctx)

	// The probes outlive each run of the guard, so that a restart in the process does not fail
	// the liveness probe; readiness is the current run's.
	probes := newProbes()
	if err := probes.serve(f.serve.probeAddr, setupLog); err != nil {
		setupLog.Error(err, "unable to serve the health probes")
		os.Exit(1)
	}
	if err := registerReady(probes); err != nil {
		setupLog.Error(err, "unable to register the metrics")
		os.Exit(1)
	}
	if webhookHandshakes, err = newHandshakes(metrics.Registry); err != nil {
		setupLog.Error(err, "unable to register the metrics")
		os.Exit(1)
	}
	// net/http's servers log failed handshakes through the standard logger: into the guard's.
	log.SetFlags(0)
	log.SetOutput(&stdlibLog{log: ctrl.Log.WithName("net-http"), failed: webhookHandshakes.failed})
	os.Exit(supervise(ctx, f.serve.restartOnFailure, setupLog, func() error {
		defer probes.set(nil)
		return run(runCtx, f, opts, drainer, probes)
	}))
}

// webhookHandshakes counts the webhook port's TLS handshakes across runs.
var webhookHandshakes *handshakes

// run runs the guard until ctx ends (nil) or it fails.
func run(ctx context.Context, f *flags, opts options, drainer *shutdown.Drainer, probes *probes) error {
	storeOpts, guardOpts, certOpts := opts.store, opts.guard, opts.certs
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
	if !f.serve.enableHTTP2 {
		// HTTP/2 stays off unless asked for: the HTTP/2 Stream Cancellation and Rapid Reset
		// CVEs (GHSA-qppj-fm5r-hxr3, GHSA-4374-p667-p6c8) let a client exhaust the server.
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	webhookTLS := append([]func(*tls.Config){}, tlsOpts...)
	clientMetrics, err := clientauth.NewMetrics(metrics.Registry)
	if err != nil {
		return err
	}
	var clients *clientauth.Verifier
	if f.serve.clientCAFile != "" {
		// Not controller-runtime's ClientCAName: it reads the CA once, from the certificate
		// folder, where in self mode ca.crt is the guard's own CA.
		clients, err = clientauth.New(f.serve.clientCAFile, clientMetrics, ctrl.Log.WithName("clientauth"))
		if err != nil {
			return err
		}
		webhookTLS = append(webhookTLS, clients.Configure)
	}
	// After clientauth's: its check runs first, and only a handshake it lets through completes.
	if webhookHandshakes != nil {
		webhookTLS = append(webhookTLS, webhookHandshakes.Configure)
	}
	webhookServer := crwebhook.NewServer(crwebhook.Options{
		Port:     f.serve.webhookPort,
		CertDir:  f.serve.webhookCertPath,
		CertName: f.serve.webhookCertName,
		KeyName:  f.serve.webhookKeyName,
		TLSOpts:  webhookTLS,
	})
	// The webhook serves once its certificate exists: a self-managed one is written by the
	// rotator after the start, and a mounted Secret may be empty (an optional volume whose
	// Secret is not there yet). Meanwhile the API server cannot reach it and fails open.
	certsReady := make(chan struct{})
	webhookServer = certs.WaitFor(webhookServer, certsReady)
	webhookServer = drainer.Server(webhookServer)

	certDir := f.serve.webhookCertPath
	if certDir == "" { // controller-runtime's default
		certDir = filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs")
	}
	metricsOpts := metricsserver.Options{BindAddress: f.serve.metricsAddr, TLSOpts: tlsOpts}
	if f.serve.metricsSecure {
		metricsOpts.SecureServing = true
		metricsOpts.FilterProvider = metricsauth.FilterProvider(splitList(f.serve.metricsAudiences))
		// The webhook's certificate, whose CA the chart knows, rather than a self-signed one
		// of controller-runtime's: the ServiceMonitor verifies it.
		serving := certs.FileCertificate(filepath.Join(certDir, f.serve.webhookCertName), filepath.Join(certDir, f.serve.webhookKeyName))
		metricsOpts.TLSOpts = append(append([]func(*tls.Config){}, tlsOpts...), func(c *tls.Config) { c.GetCertificate = serving })
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  "0", // served by probes, across runs
		PprofBindAddress:        f.serve.pprofAddr,
		WebhookServer:           webhookServer,
		Cache:                   cache.Options{ByObject: map[client.Object]cache.ByObject{wfObj: wfCache}},
		GracefulShutdownTimeout: &f.serve.gracefulShutdown,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}

	checks := map[string]healthz.Checker{}
	certFiles := []string{filepath.Join(certDir, f.serve.webhookCertName), filepath.Join(certDir, f.serve.webhookKeyName)}
	if certOpts != nil {
		rotated := make(chan struct{})
		certsChecker, err := certs.Setup(mgr, *certOpts, rotated)
		if err != nil {
			return fmt.Errorf("managing the webhook certificate: %w", err)
		}
		checks["certificate"] = certsChecker
		go certs.WaitForMounted(ctx, rotated, certsReady, ctrl.Log.WithName("setup"), certFiles...)
	} else {
		go certs.WaitForFiles(ctx, certsReady, ctrl.Log.WithName("setup"), certFiles...)
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
	if f.locks.Interval > 0 {
		reader, err := lockwatch.NewReader(mgr.GetConfig(), mgr.GetHTTPClient())
		if err != nil {
			return err
		}
		lockOpts := f.locks
		lockOpts.Namespaces, lockOpts.Registerer, lockOpts.Log = guardOpts.Namespaces, metrics.Registry, ctrl.Log.WithName("lockwatch")
		locks, err := lockwatch.New(reader, lockOpts)
		if err != nil {
			return err
		}
		if err := mgr.Add(locks); err != nil {
			return err
		}
	}

	// Ready only once the webhook port serves with its certificate loaded, and the store has
	// every workflow of the initial list: before that it cannot tell completed from running.
	checks["webhook"] = mgr.GetWebhookServer().StartedChecker()
	if clients != nil {
		checks["webhook"] = clients.Checker(f.serve.webhookPort)
	}
	checks["workflows-synced"] = synced
	checks["not-shutting-down"] = drainer.Ready()
	probes.set(checks)

	ctrl.Log.WithName("setup").Info("starting manager")
	return mgr.Start(ctx)
}

// usageExit is the exit status for a command line that did not parse: 0 for -h or --help (the
// usage was asked for, and printed), 2 for anything else.
func usageExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}
