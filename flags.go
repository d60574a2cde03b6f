package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/certs"
	"github.com/exit-guard/exit-guard/internal/lockwatch"
	"github.com/exit-guard/exit-guard/webhook"
)

// flags holds the command line, bound into the options of the guard's parts: each flag's
// default is the field's value in defaultFlags, which takes the parts' DefaultOptions.
type flags struct {
	version bool // print the version and exit
	serve   serving
	zap     zap.Options

	store completionstore.Options
	guard webhook.Options
	// locks: Interval 0 turns the lock scan off.
	locks lockwatch.Options

	cert  certSource
	certs certs.Options

	// set holds the flags given on the command line (flag.Visit), apart from their defaults.
	set map[string]bool
}

// serving is how the process serves: its endpoints, its certificate files, its shutdown.
type serving struct {
	metricsAddr      string
	metricsSecure    bool
	metricsAudiences string
	probeAddr        string
	pprofAddr        string
	webhookPort      int
	webhookCertPath  string
	webhookCertName  string
	webhookKeyName   string
	enableHTTP2      bool
	gracefulShutdown time.Duration
	shutdownDelay    time.Duration
	restartOnFailure bool
	clientCAFile     string
}

// certSource is where the webhook certificate comes from, and, when the guard makes it, the
// webhook configurations it writes the CA into.
type certSource struct {
	mode, validatingConfig, mutatingConfig string
}

// defaultFlags is the command line before any flag is parsed: the process's own defaults, and
// the DefaultOptions of the store, the guard, the lock scan and the certificates.
func defaultFlags() *flags {
	c := certs.DefaultOptions()
	c.Secret.Namespace = os.Getenv("POD_NAMESPACE")
	return &flags{
		serve: serving{
			metricsAddr:     ":8080",
			probeAddr:       ":8081",
			pprofAddr:       "0",
			webhookPort:     crwebhook.DefaultPort,
			webhookCertName: certs.CertFile,
			webhookKeyName:  certs.KeyFile,
			// Below the chart's terminationGracePeriodSeconds (30 s), so that in-flight admission
			// requests finish before the kubelet kills the container.
			gracefulShutdown: 20 * time.Second,
			// Endpoints and kube-proxy take a few seconds to drop a terminating pod; the chart's
			// terminationGracePeriodSeconds covers this delay and the graceful shutdown after it.
			shutdownDelay: 10 * time.Second,
		},
		zap:   zap.Options{TimeEncoder: zapcore.ISO8601TimeEncoder},
		store: completionstore.DefaultOptions(),
		guard: webhook.DefaultOptions(),
		locks: lockwatch.DefaultOptions(),
		cert:  certSource{mode: "external"},
		certs: c,
	}
}

// options is the command line turned into the options of the guard's parts, once.
type options struct {
	store completionstore.Options
	guard webhook.Options
	// certs is nil when the certificate comes from outside (cert-manager, the chart, a file).
	certs *certs.Options
}

// selfCertFlags are the flags only --cert-mode=self honours.
var selfCertFlags = []string{"cert-secret", "cert-namespace", "cert-dns-name", "cert-extra-dns-names",
	"validating-webhook-configuration", "mutating-webhook-configuration", "server-cert-duration", "cert-lookahead",
	"cert-check-frequency", "restart-on-failure"}

// options checks the command line and turns it into the options of the guard's parts. A flag
// given explicitly that the chosen certificate mode cannot honour is an error: judged by what
// was set, not by defaults (--cert-namespace defaults from $POD_NAMESPACE, which the chart
// always sets).
func (f *flags) options() (options, error) {
	var o options
	var err error
	o.store, o.guard = f.guardOptions()
	if o.certs, err = f.certOptions(); err != nil {
		return options{}, err
	}
	var errs []error
	if o.certs == nil {
		for _, name := range selfCertFlags {
			if f.set[name] {
				errs = append(errs, fmt.Errorf("--%s is set, but it applies only with --cert-mode=self (the mode is %s)", name, f.cert.mode))
			}
		}
	} else {
		// The rotator writes the certificate under cert-controller's names only.
		for _, c := range []struct{ flag, value, want string }{
			{"webhook-cert-name", f.serve.webhookCertName, certs.CertFile},
			{"webhook-cert-key", f.serve.webhookKeyName, certs.KeyFile},
		} {
			if f.set[c.flag] && c.value != c.want {
				errs = append(errs, fmt.Errorf("--%s=%s cannot be honoured with --cert-mode=self: the guard writes its certificate as %s", c.flag, c.value, c.want))
			}
		}
	}
	if f.locks.Interval < 0 {
		errs = append(errs, fmt.Errorf("--lock-check-interval=%s: want a duration, or 0 to turn the lock scan off", f.locks.Interval))
	}
	if f.locks.StuckAfter <= 0 {
		errs = append(errs, fmt.Errorf("--lock-stuck-after=%s: want a positive duration", f.locks.StuckAfter))
	}
	return o, errors.Join(errs...)
}

// certOptions turns the command line into the options of self-managed certificates; nil when
// the certificate comes from outside (cert-manager, the chart, a file).
func (f *flags) certOptions() (*certs.Options, error) {
	switch f.cert.mode {
	case "external":
		return nil, nil
	case "self":
	default:
		return nil, fmt.Errorf("unknown --cert-mode %q: want external or self", f.cert.mode)
	}
	o := f.certs
	o.CertDir = f.serve.webhookCertPath
	if f.cert.validatingConfig != "" {
		o.ValidatingWebhooks = []string{f.cert.validatingConfig}
	}
	if f.cert.mutatingConfig != "" {
		o.MutatingWebhooks = []string{f.cert.mutatingConfig}
	}
	if o.CertDir == "" {
		return nil, errors.New("--cert-mode=self needs --webhook-cert-path, where the certificate Secret is mounted")
	}
	return &o, nil
}

// guardOptions are the options of the store and the webhook, as the command line set them (its
// flags parse and check each value: a mode, phases, a store fallback).
func (f *flags) guardOptions() (completionstore.Options, webhook.Options) {
	return f.store, f.guard
}

// listFlag is a comma-separated list as a flag.Value: empty items are dropped.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = splitList(s)
	return nil
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
	f, fs := newFlagSet()
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	return f, nil
}

// newFlagSet is the guard's command line, bound to the flags it fills: parseFlags parses it,
// and docs/flags.md is generated from it (TestFlagReference).
func newFlagSet() (*flags, *flag.FlagSet) {
	f := defaultFlags()
	fs := flag.NewFlagSet("exit-guard", flag.ContinueOnError)
	fs.StringVar(&f.serve.metricsAddr, "metrics-bind-address", f.serve.metricsAddr,
		"The address the Prometheus metrics endpoint binds to; 0 disables it.")
	fs.BoolVar(&f.serve.metricsSecure, "metrics-secure", f.serve.metricsSecure,
		"Serve metrics over HTTPS, only to clients the API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get on the /metrics URL).")
	fs.StringVar(&f.serve.metricsAudiences, "metrics-token-audiences", f.serve.metricsAudiences,
		"With --metrics-secure, the audiences a scraper's token must be issued for, comma-separated (a projected ServiceAccount token with one of them); empty: the API server's own, which any token the API server accepts has.")
	fs.StringVar(&f.serve.probeAddr, "health-probe-bind-address", f.serve.probeAddr,
		"The address the health probes bind to.")
	fs.StringVar(&f.serve.pprofAddr, "pprof-bind-address", f.serve.pprofAddr,
		"The address Go's profiling endpoints (/debug/pprof/) bind to; 0 disables them. Keep it on 127.0.0.1 and reach it with kubectl port-forward.")
	fs.IntVar(&f.serve.webhookPort, "webhook-port", f.serve.webhookPort,
		"The port the admission webhook serves on.")
	fs.StringVar(&f.serve.webhookCertPath, "webhook-cert-path", f.serve.webhookCertPath,
		"The folder holding the webhook serving certificate; empty means controller-runtime's default.")
	fs.StringVar(&f.serve.webhookCertName, "webhook-cert-name", f.serve.webhookCertName,
		"The serving certificate's file name (with --cert-mode=external).")
	fs.StringVar(&f.serve.webhookKeyName, "webhook-cert-key", f.serve.webhookKeyName,
		"The serving key's file name (with --cert-mode=external).")
	fs.BoolVar(&f.serve.enableHTTP2, "enable-http2", f.serve.enableHTTP2,
		"Serve the webhook and metrics over HTTP/2 as well as HTTP/1.1 (off by default, see main.go).")
	fs.DurationVar(&f.serve.gracefulShutdown, "graceful-shutdown-timeout", f.serve.gracefulShutdown,
		"How long to wait for in-flight requests and runnables on shutdown.")
	fs.DurationVar(&f.serve.shutdownDelay, "shutdown-delay", f.serve.shutdownDelay,
		"How long to keep answering admissions after SIGTERM (unready, closing kept-alive connections) before stopping, so that the Service stops routing to this pod first.")
	fs.Var(&f.guard.Mode, "mode",
		"What to do with a pod the guard would refuse: enforce (deny), warn (admit with a warning, an Event and a mark) or dry-run (admit, log, count and mark).")
	fs.Var(&f.guard.DenyPhases, "deny-phases",
		"Comma-separated terminal phases whose exit handlers are refused; add Failed,Error to stop duplicate failure notices.")
	fs.Var(&f.guard.StoreFallback, "store-fallback",
		"What the store alone may refuse when no live read answers within the budget: requeue (workflows seen deleted; for workflows seen completed, the pods Argo's controller sends again on its next pass, and the rest as fresh), fresh (workflows seen deleted; workflows seen completed while the store's newest write is younger than --store-fresh-for), tombstone (only workflows seen deleted) or completion (workflows seen deleted or completed, whatever is refused: a refused agent pod fails a retried workflow on Argo 3.4 and 3.5).")
	fs.Var(&f.guard.Cover, "cover",
		"Which pods of a completed workflow to refuse: all (the default: exit handlers, the agent, lifecycle hooks at every level and ordinary steps), or a comma-separated list of exit-handlers, hooks and steps (exit-handler and agent pods are always judged).")
	fs.BoolVar(&f.guard.StoreFirst, "store-first", f.guard.StoreFirst,
		"Admit exit-handler pods from the store without a live read when it holds no completion (lower latency; a lagging watch then lets stale pods through).")
	fs.DurationVar(&f.guard.LiveReadTimeout, "live-read-timeout", f.guard.LiveReadTimeout,
		"How long one attempt of the live read of a pod's workflow may take before another starts beside it.")
	fs.DurationVar(&f.guard.LiveReadBudget, "live-read-budget", f.guard.LiveReadBudget,
		"How long the live read may take in all, retries included; past it the store decides. Keep it at least a second below the webhook's timeoutSeconds.")
	fs.DurationVar(&f.guard.HookStepReadBudget, "hook-step-read-budget", f.guard.HookStepReadBudget,
		"For a lifecycle-hook or step pod (many a workflow, sent one after another): how long the live read of its workflow may take in all; past it the store decides. Keep it below a second: Argo's pass has 30 s for all its pods.")
	fs.DurationVar(&f.guard.GetBesideListAfter, "live-read-get-after", f.guard.GetBesideListAfter,
		"How long the LIST of a live read may go unanswered before a GET of the workflow starts beside it (the first answer wins; negative: never).")
	fs.DurationVar(&f.guard.TaskSetRepeatsFor, "taskset-repeats-for", f.guard.TaskSetRepeatsFor,
		fmt.Sprintf("How long after a WorkflowTaskSet create admitted on a live read the same create (Argo's next pass, which fails with AlreadyExists) is admitted without a read, while the store holds the workflow running; at most %s; 0: this default; negative: every create is read.", webhook.MaxTaskSetRepeatsFor))
	fs.DurationVar(&f.guard.EventReadTimeout, "event-read-timeout", f.guard.EventReadTimeout,
		"For an Event that says a workflow failed: how long one attempt of the live read of its workflow may take before another starts beside it.")
	fs.DurationVar(&f.guard.EventReadBudget, "event-read-budget", f.guard.EventReadBudget,
		"For an Event that says a workflow failed: how long the live read may take in all; past it the store decides. Short: Argo sends a namespace's Events one at a time. Keep it at least a second below the Event webhook's timeoutSeconds.")
	fs.DurationVar(&f.guard.StoreFreshFor, "store-fresh-for", f.guard.StoreFreshFor,
		"With --store-fallback=fresh (and requeue, for what Argo does not send again: TaskSet writes of the exit handler's task, Events): how young the newest workflow write the store received (by its managed fields' time) must be for the store's completion to refuse when no live read answers. Longer stops more stale writes while the API server hangs, and refuses more retried workflows whose retry the watch has not delivered.")
	fs.DurationVar(&f.guard.StoreRefusalsFor, "store-refusals-for", f.guard.StoreRefusalsFor,
		"How long the store alone may refuse one workflow's pods and writes while no live read answers, from the first refusal of a continuous run (refused again within 30 s) that no live read has confirmed since; past it they are admitted as unconfirmed-completion (logged, counted, alerted), so that a retry the guard cannot see waits at most this long.")
	fs.IntVar(&f.guard.MaxConcurrentDecisions, "max-concurrent-decisions", f.guard.MaxConcurrentDecisions,
		"How many admissions may be decided at once; one past it reads nothing live and the store decides (counted as a live-read failure of kind shed).")
	fs.StringVar(&f.guard.ExpectedRequester, "expected-requester", f.guard.ExpectedRequester,
		"The user that sends what the guard judges (Argo's workflow controller: system:serviceaccount:<namespace>:<name>). Refusals for anyone else are counted apart (exit_guard_unexpected_requester_decisions_total) and their Events are Normal; empty: no check. Without --webhook-client-ca-file a client that reaches the port can name any user.")
	fs.StringVar(&f.serve.clientCAFile, "webhook-client-ca-file", f.serve.clientCAFile,
		"A PEM file of the CA that signs the API server's client certificate for admission webhooks: when set, the webhook answers only clients that present a certificate it signed (for client authentication), reading the file again when it changes.")
	fs.DurationVar(&f.store.TTL, "completion-ttl", f.store.TTL,
		"How long the store remembers a workflow after its last change.")
	fs.DurationVar(&f.store.SweepInterval, "sweep-interval", f.store.SweepInterval,
		"How often expired records are removed from the store.")
	fs.DurationVar(&f.locks.Interval, "lock-check-interval", f.locks.Interval,
		"How often to look for workflows waiting on a synchronization lock that Argo's controller keeps for a completed workflow (exit_guard_sync_stuck_workflows; one LIST of the Pending workflows each time); 0 turns it off.")
	fs.DurationVar(&f.locks.StuckAfter, "lock-stuck-after", f.locks.StuckAfter,
		"How long such a waiter must be stuck, with no waiter of its lock served, before it is reported.")
	fs.BoolVar(&f.serve.restartOnFailure, "restart-on-failure", f.serve.restartOnFailure,
		"When the guard fails (the API server, its certificate, a port), restart it in the process after a backoff instead of exiting; for the sidecar in Argo's controller pod, where a container that exits makes the pod NotReady.")
	fs.StringVar(&f.cert.mode, "cert-mode", f.cert.mode,
		"Where the webhook certificate comes from: external (files in --webhook-cert-path, e.g. from cert-manager or the chart) or self (the guard creates and rotates it).")
	fs.StringVar(&f.certs.Secret.Name, "cert-secret", f.certs.Secret.Name,
		"With --cert-mode=self: the Secret that holds the CA and serving certificate.")
	fs.StringVar(&f.certs.Secret.Namespace, "cert-namespace", f.certs.Secret.Namespace,
		"With --cert-mode=self: the namespace of that Secret (default $POD_NAMESPACE).")
	fs.StringVar(&f.certs.DNSName, "cert-dns-name", f.certs.DNSName,
		"With --cert-mode=self: the webhook Service's DNS name, <service>.<namespace>.svc.")
	fs.Var((*listFlag)(&f.certs.ExtraDNSNames), "cert-extra-dns-names",
		"With --cert-mode=self: comma-separated further DNS names of the serving certificate.")
	fs.Var((*listFlag)(&f.guard.Namespaces), "namespaces",
		"Comma-separated namespaces to watch and guard; empty means all.")
	fs.StringVar(&f.cert.validatingConfig, "validating-webhook-configuration", f.cert.validatingConfig,
		"With --cert-mode=self: the ValidatingWebhookConfiguration to write the CA into.")
	fs.StringVar(&f.cert.mutatingConfig, "mutating-webhook-configuration", f.cert.mutatingConfig,
		"With --cert-mode=self: the MutatingWebhookConfiguration to write the CA into.")
	fs.DurationVar(&f.certs.ServerCertDuration, "server-cert-duration", f.certs.ServerCertDuration,
		"With --cert-mode=self: how long a serving certificate is valid.")
	fs.DurationVar(&f.certs.Lookahead, "cert-lookahead", f.certs.Lookahead,
		"With --cert-mode=self: how long before expiry certificates are renewed.")
	fs.DurationVar(&f.certs.CheckFrequency, "cert-check-frequency", f.certs.CheckFrequency,
		"With --cert-mode=self: how often expiry is checked.")
	f.zap.BindFlags(fs)
	fs.BoolVar(&f.version, "version", false, "Print the version, commit and build date, and exit.")
	fs.Usage = func() {
		_, _ = fmt.Fprint(fs.Output(), `Usage:
  exit-guard [flags]          run the guard (the chart's Deployment or sidecar does)
  exit-guard check [flags]    prove, with a dry-run exit-handler pod, that the API server calls the guard
                              and that it answers (helm test runs it; exit-guard check -h for its flags)
  exit-guard affected [flags] before installing: find Argo's workflow controllers and say whether each
                              sends what the guard refuses (read-only; exit-guard affected -h for its flags)
  exit-guard --version        print the version, commit and build date
`)
		for _, g := range flagGroups {
			_, _ = fmt.Fprintf(fs.Output(), "\n%s:\n", g.title)
			fs.VisitAll(func(fl *flag.Flag) {
				if groupOf(fl.Name) == g.name {
					printFlag(fs.Output(), fl)
				}
			})
		}
	}
	return f, fs
}

// A flag's group, in -h and docs/flags.md: what users tune (each a chart value under guard.),
// what the chart sets from its other values (ports, certificates, logging, shutdown: set the
// value), and the rest (extraArgs passes them). hack/chartcheck's TestFlagGroupsAreTheCharts
// holds the first two to the flags the chart renders.
var flagGroups = []struct{ name, title string }{
	{"tune", "Tune these (the chart's guard.* values set them)"},
	{"chart", "Set by the chart from its values (set the value, not the flag)"},
	{"other", "Everything else (the chart's extraArgs passes them)"},
}

var (
	tunedFlags = []string{"mode", "deny-phases", "cover", "namespaces", "expected-requester", "store-first", "store-fallback",
		"store-fresh-for", "store-refusals-for", "live-read-budget", "live-read-timeout", "live-read-get-after", "hook-step-read-budget",
		"event-read-budget", "event-read-timeout", "taskset-repeats-for", "completion-ttl", "sweep-interval", "lock-check-interval",
		"lock-stuck-after", "max-concurrent-decisions"}
	chartFlags = []string{"webhook-port", "webhook-cert-path", "webhook-client-ca-file", "metrics-bind-address", "metrics-secure",
		"metrics-token-audiences", "health-probe-bind-address", "pprof-bind-address", "shutdown-delay", "graceful-shutdown-timeout",
		"zap-log-level", "zap-encoder", "cert-mode", "cert-secret", "cert-dns-name", "validating-webhook-configuration",
		"mutating-webhook-configuration", "server-cert-duration", "cert-lookahead", "cert-check-frequency", "restart-on-failure"}
)

// groupOf is the group of the flag name: tune, chart or other.
func groupOf(name string) string {
	switch {
	case slices.Contains(tunedFlags, name):
		return "tune"
	case slices.Contains(chartFlags, name):
		return "chart"
	default:
		return "other"
	}
}

// printFlag prints fl as flag.PrintDefaults does.
func printFlag(w io.Writer, fl *flag.Flag) {
	name, usage := flag.UnquoteUsage(fl)
	line := "  -" + fl.Name
	if name != "" {
		line += " " + name
	}
	line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
	if fl.DefValue != "" && fl.DefValue != "false" && fl.DefValue != "0" && fl.DefValue != "[]" {
		if fmt.Sprintf("%T", fl.Value) == "*flag.stringValue" {
			line += fmt.Sprintf(" (default %q)", fl.DefValue)
		} else {
			line += " (default " + fl.DefValue + ")"
		}
	}
	_, _ = fmt.Fprintln(w, line)
}
