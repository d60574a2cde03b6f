// Command exit-guard runs the exit-guard admission webhook beside Argo Workflows: it watches
// Workflows, remembers which ones completed, and refuses exit-handler pods that a stale copy
// of a completed workflow tries to create.
package main

import (
	"crypto/tls"
	"flag"
	"os"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// flags holds the command line.
type flags struct {
	metricsAddr      string
	probeAddr        string
	webhookPort      int
	webhookCertPath  string
	webhookCertName  string
	webhookKeyName   string
	enableHTTP2      bool
	gracefulShutdown time.Duration
	zap              zap.Options
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{zap: zap.Options{TimeEncoder: zapcore.ISO8601TimeEncoder}}
	fs := flag.NewFlagSet("exit-guard", flag.ContinueOnError)
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080",
		"The address the Prometheus metrics endpoint binds to; 0 disables it.")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "The address the health probes bind to.")
	fs.IntVar(&f.webhookPort, "webhook-port", webhook.DefaultPort, "The port the admission webhook serves on.")
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
	f.zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return f, nil
}

func main() {
	f, err := parseFlags(os.Args[1:])
	if err != nil {
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&f.zap)))
	setupLog := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		setupLog.Error(err, "unable to build the scheme")
		os.Exit(1)
	}

	var tlsOpts []func(*tls.Config)
	if !f.enableHTTP2 {
		// HTTP/2 stays off unless asked for: the HTTP/2 Stream Cancellation and Rapid Reset
		// CVEs (GHSA-qppj-fm5r-hxr3, GHSA-4374-p667-p6c8) let a client exhaust the server.
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	webhookServer := webhook.NewServer(webhook.Options{
		Port:     f.webhookPort,
		CertDir:  f.webhookCertPath,
		CertName: f.webhookCertName,
		KeyName:  f.webhookKeyName,
		TLSOpts:  tlsOpts,
	})

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: f.metricsAddr, TLSOpts: tlsOpts},
		HealthProbeBindAddress:  f.probeAddr,
		WebhookServer:           webhookServer,
		GracefulShutdownTimeout: &f.gracefulShutdown,
	})
	if err != nil {
		setupLog.Error(err, "unable to create the manager")
		os.Exit(1)
	}

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to add the liveness check")
		os.Exit(1)
	}
	// Ready only once the webhook port serves with its certificate loaded.
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		setupLog.Error(err, "unable to add the readiness check")
		os.Exit(1)
	}

	setupLog.Info("starting manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		setupLog.Error(err, "manager stopped with an error")
		os.Exit(1)
	}
}
