package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/affected"
)

// affectedFlags are the flags of `exit-guard affected`.
type affectedFlags struct {
	namespace, controller string
	timeout               time.Duration
}

// newAffectedFlagSet is the command line of `exit-guard affected` (docs/flags.md is generated
// from it).
func newAffectedFlagSet() (*affectedFlags, *flag.FlagSet) {
	a := &affectedFlags{}
	fs := flag.NewFlagSet("exit-guard affected", flag.ContinueOnError)
	fs.StringVar(&a.namespace, "namespace", "",
		"Look for Argo's workflow controllers in this namespace only (default: every namespace; needs list on Deployments there).")
	fs.StringVar(&a.controller, "controller", "",
		"Read this Deployment only, as namespace/name, instead of looking for controllers by their labels: needs get on it and on ConfigMaps in its namespace, no list.")
	fs.DurationVar(&a.timeout, "timeout", 30*time.Second, "How long the reads may take.")
	return a, fs
}

// runAffected is `exit-guard affected`: before installing anything, it finds Argo's workflow
// controllers (internal/affected), says of each whether it sends what exit-guard refuses, why,
// and the fix upstream offers, and returns a status scripts can test (0 not affected, 1
// affected, 2 error, 3 cannot tell or no controller found).
func runAffected(args []string, out io.Writer) int {
	a, fs := newAffectedFlagSet()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return affected.ExitError
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "exit-guard affected: unexpected arguments %q\n", fs.Args())
		return affected.ExitError
	}
	var ns, name string
	if a.controller != "" {
		var ok bool
		ns, name, ok = strings.Cut(a.controller, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			fmt.Fprintf(os.Stderr, "exit-guard affected: --controller=%q: want namespace/name\n", a.controller)
			return affected.ExitError
		}
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "exit-guard affected:", err)
		return affected.ExitError
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fmt.Fprintln(os.Stderr, "exit-guard affected:", err)
		return affected.ExitError
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "exit-guard affected:", err)
		return affected.ExitError
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	var controllers []affected.Controller
	if name != "" {
		ctl, err := affected.Get(ctx, c, ns, name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "exit-guard affected:", err)
			return affected.ExitError
		}
		controllers = []affected.Controller{ctl}
	} else if controllers, err = affected.Find(ctx, c, a.namespace); err != nil {
		fmt.Fprintln(os.Stderr, "exit-guard affected:", err)
		return affected.ExitError
	}
	findings := make([]affected.Finding, 0, len(controllers))
	for _, ctl := range controllers {
		findings = append(findings, affected.Judge(ctl))
	}
	if _, err := io.WriteString(out, affected.Report(findings, a.namespace)); err != nil {
		fmt.Fprintln(os.Stderr, "exit-guard affected:", err)
		return affected.ExitError
	}
	return affected.Code(findings)
}
