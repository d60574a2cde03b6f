package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/certs"
	"github.com/exit-guard/exit-guard/webhook"
)

// flags holds the command line.
type flags struct {
	version          bool // print the version and exit
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
	zap              zap.Options
	restartOnFailure bool

	mode               string
	denyPhases         string
	hooks              bool
	strict             bool
	storeFirst         bool
	liveReadTimeout    time.Duration
	liveReadBudget     time.Duration
	getBesideListAfter time.Duration
	taskSetRepeatsFor  time.Duration
	eventTimeout       time.Duration
	eventBudget        time.Duration
	storeFallback      string
	storeFreshFor      time.Duration
	namespaces         string
	maxDecisions       int
	expectedUser       string
	clientCAFile       string
	completionTTL      time.Duration
	sweepInterval      time.Duration
	lockCheck          time.Duration
	lockStuckAfter     time.Duration

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

	// set holds the flags given on the command line (flag.Visit), apart from their defaults.
	set map[string]bool
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
	"cert-check-frequency"}

// options checks the command line and turns it into the options of the guard's parts. A flag
// given explicitly that the chosen certificate mode cannot honour is an error: judged by what
// was set, not by defaults (--cert-namespace defaults from $POD_NAMESPACE, which the chart
// always sets).
func (f *flags) options() (options, error) {
	var o options
	var err error
	if o.store, o.guard, err = f.guardOptions(); err != nil {
		return options{}, err
	}
	if o.certs, err = f.certOptions(); err != nil {
		return options{}, err
	}
	var errs []error
	if o.certs == nil {
		for _, name := range selfCertFlags {
			if f.set[name] {
				errs = append(errs, fmt.Errorf("--%s is set, but it applies only with --cert-mode=self (the mode is %s)", name, f.certMode))
			}
		}
	} else {
		// The rotator writes the certificate under cert-controller's names only.
		for _, c := range []struct{ flag, value, want string }{
			{"webhook-cert-name", f.webhookCertName, certs.CertFile},
			{"webhook-cert-key", f.webhookKeyName, certs.KeyFile},
		} {
			if f.set[c.flag] && c.value != c.want {
				errs = append(errs, fmt.Errorf("--%s=%s cannot be honoured with --cert-mode=self: the guard writes its certificate as %s", c.flag, c.value, c.want))
			}
		}
	}
	if f.lockCheck < 0 {
		errs = append(errs, fmt.Errorf("--lock-check-interval=%s: want a duration, or 0 to turn the lock scan off", f.lockCheck))
	}
	if f.lockStuckAfter <= 0 {
		errs = append(errs, fmt.Errorf("--lock-stuck-after=%s: want a positive duration", f.lockStuckAfter))
	}
	return o, errors.Join(errs...)
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
			Mode:                   mode,
			DenyPhases:             phases,
			Hooks:                  f.hooks,
			Strict:                 f.strict,
			StoreFirst:             f.storeFirst,
			LiveReadTimeout:        f.liveReadTimeout,
			LiveReadBudget:         f.liveReadBudget,
			GetBesideListAfter:     f.getBesideListAfter,
			TaskSetRepeatsFor:      f.taskSetRepeatsFor,
			EventReadTimeout:       f.eventTimeout,
			EventReadBudget:        f.eventBudget,
			StoreFallback:          fallback,
			StoreFreshFor:          f.storeFreshFor,
			Namespaces:             namespaces,
			MaxConcurrentDecisions: f.maxDecisions,
			ExpectedRequester:      f.expectedUser,
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
	f := &flags{zap: zap.Options{TimeEncoder: zapcore.ISO8601TimeEncoder}}
	fs := flag.NewFlagSet("exit-guard", flag.ContinueOnError)
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080",
		"The address the Prometheus metrics endpoint binds to; 0 disables it.")
	fs.BoolVar(&f.metricsSecure, "metrics-secure", false,
		"Serve metrics over HTTPS, only to clients the API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get on the /metrics URL).")
	fs.StringVar(&f.metricsAudiences, "metrics-token-audiences", "",
		"With --metrics-secure, the audiences a scraper's token must be issued for, comma-separated (a projected ServiceAccount token with one of them); empty: the API server's own, which any token the API server accepts has.")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "The address the health probes bind to.")
	fs.StringVar(&f.pprofAddr, "pprof-bind-address", "0",
		"The address Go's profiling endpoints (/debug/pprof/) bind to; 0 disables them. Keep it on 127.0.0.1 and reach it with kubectl port-forward.")
	fs.IntVar(&f.webhookPort, "webhook-port", crwebhook.DefaultPort, "The port the admission webhook serves on.")
	fs.StringVar(&f.webhookCertPath, "webhook-cert-path", "",
		"The folder holding the webhook serving certificate; empty means controller-runtime's default.")
	fs.StringVar(&f.webhookCertName, "webhook-cert-name", certs.CertFile, "The serving certificate's file name (with --cert-mode=external).")
	fs.StringVar(&f.webhookKeyName, "webhook-cert-key", certs.KeyFile, "The serving key's file name (with --cert-mode=external).")
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
	fs.DurationVar(&f.getBesideListAfter, "live-read-get-after", 25*time.Millisecond,
		"How long the LIST of a live read may go unanswered before a GET of the workflow starts beside it (the first answer wins; negative: never).")
	fs.DurationVar(&f.taskSetRepeatsFor, "taskset-repeats-for", 5*time.Second,
		"How long after a WorkflowTaskSet create admitted on a live read the same create (Argo's next pass, which fails with AlreadyExists) is admitted without a read, while the store holds the workflow running; at most 10s; 0: this default; negative: every create is read.")
	fs.DurationVar(&f.eventTimeout, "event-read-timeout", 250*time.Millisecond,
		"For an Event that says a workflow failed: how long one attempt of the live read of its workflow may take before another starts beside it.")
	fs.DurationVar(&f.eventBudget, "event-read-budget", time.Second,
		"For an Event that says a workflow failed: how long the live read may take in all; past it the store decides. Short: Argo sends a namespace's Events one at a time. Keep it at least a second below the Event webhook's timeoutSeconds.")
	fs.StringVar(&f.storeFallback, "store-fallback", string(webhook.FallbackRequeue),
		"What the store alone may refuse when no live read answers within the budget: requeue (workflows seen deleted; for workflows seen completed, the pods Argo's controller sends again on its next pass, and the rest as fresh), fresh (workflows seen deleted; workflows seen completed while the store's newest write is younger than --store-fresh-for), tombstone (only workflows seen deleted) or completion (workflows seen deleted or completed, whatever is refused: a refused agent pod fails a retried workflow on Argo 3.4 and 3.5).")
	fs.DurationVar(&f.storeFreshFor, "store-fresh-for", 5*time.Second,
		"With --store-fallback=fresh (and requeue, for what Argo does not send again: TaskSet writes of the exit handler's task, Events): how young the newest workflow write the store received (by its managed fields' time) must be for the store's completion to refuse when no live read answers. Longer stops more stale writes while the API server hangs, and refuses more retried workflows whose retry the watch has not delivered.")
	fs.StringVar(&f.namespaces, "namespaces", "", "Comma-separated namespaces to watch and guard; empty means all.")
	fs.IntVar(&f.maxDecisions, "max-concurrent-decisions", 128,
		"How many admissions may be decided at once; one past it reads nothing live and the store decides (counted as a live-read failure of kind shed).")
	fs.StringVar(&f.expectedUser, "expected-requester", "",
		"The user that sends what the guard judges (Argo's workflow controller: system:serviceaccount:<namespace>:<name>). Refusals for anyone else are counted apart (exit_guard_unexpected_requester_decisions_total) and their Events are Normal; empty: no check. Without --webhook-client-ca-file a client that reaches the port can name any user.")
	fs.StringVar(&f.clientCAFile, "webhook-client-ca-file", "",
		"A PEM file of the CA that signs the API server's client certificate for admission webhooks: when set, the webhook answers only clients that present a certificate it signed (for client authentication), reading the file again when it changes.")
	fs.DurationVar(&f.completionTTL, "completion-ttl", 10*time.Minute, "How long the store remembers a workflow after its last change.")
	fs.DurationVar(&f.sweepInterval, "sweep-interval", 30*time.Second, "How often expired records are removed from the store.")
	fs.DurationVar(&f.lockCheck, "lock-check-interval", time.Minute,
		"How often to look for workflows waiting on a synchronization lock that Argo's controller keeps for a completed workflow (exit_guard_sync_stuck_workflows; one LIST of the Pending workflows each time); 0 turns it off.")
	fs.DurationVar(&f.lockStuckAfter, "lock-stuck-after", 5*time.Minute,
		"How long such a waiter must be stuck, with no waiter of its lock served, before it is reported.")
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
	fs.BoolVar(&f.version, "version", false, "Print the version, commit and build date, and exit.")
	fs.Usage = func() {
		_, _ = fmt.Fprint(fs.Output(), `Usage:
  exit-guard [flags]          run the guard (the chart's Deployment or sidecar does)
  exit-guard check [flags]    prove, with a dry-run exit-handler pod, that the API server calls the guard
                              and that it answers (helm test runs it; exit-guard check -h for its flags)
  exit-guard --version        print the version, commit and build date

Flags:
`)
		fs.PrintDefaults()
	}
	return f, fs
}
