package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/webhook"
)

func TestFlagsBecomeGuardOptions(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    webhook.Options
		wantTTL time.Duration
		wantErr bool
	}{
		// No flag: the options are the guard's and the store's DefaultOptions, unchanged (the
		// flags bind into them), and those enforce on Succeeded with live reads.
		{name: "the defaults are DefaultOptions", want: webhook.DefaultOptions(), wantTTL: completionstore.DefaultOptions().TTL},
		{name: "every policy flag is carried over",
			args: []string{"--mode=warn", "--deny-phases=succeeded, Failed,Error", "--cover=exit-handlers,hooks", "--store-first",
				"--live-read-timeout=300ms", "--live-read-budget=2s", "--hook-step-read-budget=500ms", "--live-read-get-after=-1s", "--taskset-repeats-for=-1s", "--event-read-timeout=100ms", "--event-read-budget=500ms",
				"--store-fallback=completion", "--store-fresh-for=30s", "--store-refusals-for=30s", "--namespaces=a, b,", "--completion-ttl=1h",
				"--max-concurrent-decisions=7", "--expected-requester=system:serviceaccount:argo:wfc"},
			want: webhook.Options{Mode: webhook.ModeWarn, DenyPhases: []argo.Phase{argo.PhaseSucceeded, argo.PhaseFailed, argo.PhaseError},
				Cover: webhook.Coverage{NoSteps: true}, StoreFirst: true, LiveReadTimeout: 300 * time.Millisecond, LiveReadBudget: 2 * time.Second, HookStepReadBudget: 500 * time.Millisecond, GetBesideListAfter: -time.Second, TaskSetRepeatsFor: -time.Second,
				EventReadTimeout: 100 * time.Millisecond, EventReadBudget: 500 * time.Millisecond,
				StoreFallback: webhook.FallbackCompletion, StoreFreshFor: 30 * time.Second, StoreRefusalsFor: 30 * time.Second, Namespaces: []string{"a", "b"},
				MaxConcurrentDecisions: 7, ExpectedRequester: "system:serviceaccount:argo:wfc", EventSource: "exit-guard"},
			wantTTL: time.Hour},
		{name: "--cover=all is the default", args: []string{"--cover=all"}, want: webhook.DefaultOptions(), wantTTL: completionstore.DefaultOptions().TTL},
		{name: "an unknown coverage is refused", args: []string{"--cover=exit-handlers,pods"}, wantErr: true},
		{name: "an empty coverage is refused", args: []string{"--cover="}, wantErr: true},
		{name: "an unknown mode is refused", args: []string{"--mode=block"}, wantErr: true},
		{name: "a non-terminal deny phase is refused", args: []string{"--deny-phases=Running"}, wantErr: true},
		{name: "an empty deny-phase list is refused", args: []string{"--deny-phases=,"}, wantErr: true},
		{name: "an unknown store fallback is refused", args: []string{"--store-fallback=always"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A value the flag cannot take is refused as the command line is parsed, with the
			// flag's name.
			f, err := parseFlags(tt.args)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseFlags error = %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			store, opts := f.guardOptions()
			if diff := cmp.Diff(tt.want, opts); diff != "" {
				t.Errorf("webhook options (-want +got):\n%s", diff)
			}
			if store.TTL != tt.wantTTL {
				t.Errorf("store TTL = %v, want %v", store.TTL, tt.wantTTL)
			}
		})
	}
}

func TestUnknownFlagIsAnError(t *testing.T) {
	if _, err := parseFlags([]string{"--no-such-flag"}); err == nil {
		t.Error("parseFlags accepted an unknown flag")
	}
}

// A flag given explicitly that the certificate mode cannot honour is refused with a reason;
// one left at its default, or set from the environment's default, is not judged.
func TestFlagsTheCertModeCannotHonourAreRefused(t *testing.T) {
	self := []string{"--cert-mode=self", "--webhook-cert-path=/certs", "--cert-dns-name=g.argo.svc"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "self mode with its own flags", args: append(self, "--cert-secret=s", "--cert-lookahead=24h")},
		{name: "self mode with the certificate names it writes, given explicitly", args: append(self, "--webhook-cert-name=tls.crt", "--webhook-cert-key=tls.key")},
		{name: "self mode with another certificate name", args: append(self, "--webhook-cert-name=server.crt"), wantErr: "--webhook-cert-name=server.crt cannot be honoured"},
		{name: "self mode with another key name", args: append(self, "--webhook-cert-key=server.key"), wantErr: "--webhook-cert-key=server.key cannot be honoured"},
		{name: "external mode with other file names", args: []string{"--webhook-cert-name=server.crt", "--webhook-cert-key=server.key"}},
		{name: "external mode with a self-mode flag", args: []string{"--cert-secret=s"}, wantErr: "--cert-secret is set, but it applies only with --cert-mode=self"},
		{name: "external mode with the namespace flag", args: []string{"--cert-mode=external", "--cert-namespace=argo"}, wantErr: "--cert-namespace is set"},
		{name: "the lock scan off", args: []string{"--lock-check-interval=0s"}},
		{name: "a negative lock scan interval", args: []string{"--lock-check-interval=-1m"}, wantErr: "--lock-check-interval=-1m0s"},
		{name: "no time to be stuck", args: []string{"--lock-stuck-after=0s"}, wantErr: "--lock-stuck-after=0s: want a positive duration"},
	}
	t.Setenv("POD_NAMESPACE", "argo") // as the chart sets it: the default of --cert-namespace
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := parseFlags(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.options()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("options() = %v, want no error", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("options() = %v, want an error saying %q", err, tt.wantErr)
			}
		})
	}
}

// TestVersion: --version is a flag, and it prints what the build set (make build sets the
// chart's appVersion, the commit and the date), or "unknown" for what neither the build nor
// the toolchain recorded.
func TestVersion(t *testing.T) {
	f, err := parseFlags([]string{"--version"})
	if err != nil || !f.version {
		t.Fatalf("--version: %v, set %v", err, f != nil && f.version)
	}
	defer func(v, c, d string) { version, commit, date = v, c, d }(version, commit, date)
	version, commit, date = "1.2.3", "0123abc", "2026-12-03T00:00:00Z"
	if got, want := versionLine(), "exit-guard 1.2.3 (commit 0123abc, built 2026-12-03T00:00:00Z, go"; !strings.HasPrefix(got, want) {
		t.Errorf("versionLine() = %q, want it to begin %q", got, want)
	}
	version, commit, date = "", "", ""
	if v, _, _ := buildVersion(); v != "unknown" {
		t.Errorf("a test binary's version = %q, want unknown (its module version is (devel), and no build set one)", v)
	}
}

// TestNoCoverFlagButCover: a first release carries no deprecated flag. The three that said what
// was covered before --cover are refused as unknown, so a command line that names one fails at
// start-up, saying which, rather than guarding other pods than it says.
func TestNoCoverFlagButCover(t *testing.T) {
	for _, name := range []string{"cover-hooks", "cover-steps", "strict"} {
		if _, err := parseFlags([]string{"--" + name + "=true"}); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("--%s=true: error %v, want it refused by name", name, err)
		}
	}
}

// -h and --help print the usage and exit 0, for the guard and for `exit-guard check`; a command
// line that does not parse exits 2.
func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}} {
		_, err := parseFlags(args)
		if got := usageExit(err); got != 0 {
			t.Errorf("exit-guard %s: exit %d (%v), want 0", args[0], got, err)
		}
		if got := runCheck(args); got != 0 {
			t.Errorf("exit-guard check %s: exit %d, want 0", args[0], got)
		}
	}
	_, err := parseFlags([]string{"--no-such-flag"})
	if got := usageExit(err); got != 2 {
		t.Errorf("an unknown flag: exit %d, want 2", got)
	}
}
