package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/exit-guard/exit-guard/internal/check"
)

// checkFlags are the flags of `exit-guard check`.
type checkFlags struct {
	namespace, image string
	timeout          time.Duration
}

// newCheckFlagSet is the command line of `exit-guard check` (docs/flags.md is generated from it).
func newCheckFlagSet() (*checkFlags, *flag.FlagSet) {
	c := &checkFlags{}
	fs := flag.NewFlagSet("exit-guard check", flag.ContinueOnError)
	fs.StringVar(&c.namespace, "namespace", os.Getenv("POD_NAMESPACE"),
		"The namespace to send the dry-run exit-handler pod to: one the guard watches (default $POD_NAMESPACE).")
	fs.StringVar(&c.image, "image", "pause", "The image of the dry-run pod (never pulled; image policies may look at it).")
	fs.DurationVar(&c.timeout, "timeout", 3*time.Minute,
		"How long the check may take: until then it sends the dry-run pod again every second while the guard does not answer (its webhook not yet served; a new install's certificate can take a minute or two to reach its pods).")
	return c, fs
}

// runCheck is `exit-guard check`: it proves that the API server reaches the guard and that the
// guard refuses a stale exit-handler pod (internal/check), waiting for the guard to answer, and
// returns the exit status.
func runCheck(args []string) int {
	c, fs := newCheckFlagSet()
	if err := fs.Parse(args); err != nil {
		return usageExit(err)
	}
	if c.timeout <= 0 {
		fmt.Fprintln(os.Stderr, "exit-guard check: --timeout must be positive")
		return 2
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "exit-guard check: FAIL:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	res, err := check.Run(ctx, cfg, check.Options{Namespace: c.namespace, Image: c.image})
	if err != nil {
		fmt.Fprintln(os.Stderr, "exit-guard check: FAIL:", err)
		return 1
	}
	verdict := res.Verdict
	if res.Reason != "" {
		verdict += " (" + string(res.Reason) + ")"
	}
	fmt.Printf("exit-guard check: OK: the API server called the guard, which %s the dry-run exit-handler pod %s/%s of the workflow %s, which does not exist.\n%s\n",
		verdict, c.namespace, res.Pod, res.Workflow, res.Message)
	if res.Argo != "" {
		fmt.Println(res.Argo)
	} else {
		fmt.Println("exit-guard: the guard that answered has judged no pod of Argo's yet, so it cannot say which Argo Workflows release runs here; run a workflow, then check again (or compare your controller's version with the README's Am I affected?).")
	}
	return 0
}
