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
	verdict := res.Verdict
	if res.Reason != "" {
		verdict += " (" + string(res.Reason) + ")"
	}
	fmt.Printf("exit-guard check: OK: the API server called the guard, which %s the dry-run exit-handler pod %s/%s of the workflow %s, which does not exist.\n%s\n",
		verdict, *namespace, res.Pod, res.Workflow, res.Message)
	return 0
}
