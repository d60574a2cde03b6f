package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The environment that carries the restart state across an exec.
const (
	envRestarts = "EXIT_GUARD_RESTARTS"
	envBackoff  = "EXIT_GUARD_RESTART_BACKOFF"
)

// maxRestartBackoff bounds the wait between two restarts: each restart lists every Workflow
// again, which a lasting failure must not do every few seconds.
const maxRestartBackoff = time.Minute

// restart is how many times the guard restarted in its process, and the wait before the next.
type restart struct {
	count   int
	backoff time.Duration
}

func restartFromEnv() restart {
	r := restart{backoff: time.Second}
	if n, err := strconv.Atoi(os.Getenv(envRestarts)); err == nil && n > 0 {
		r.count = n
	}
	if d, err := time.ParseDuration(os.Getenv(envBackoff)); err == nil && d > 0 {
		r.backoff = min(d, maxRestartBackoff)
	}
	return r
}

// next is the state of the next restart after a run that lasted ran: the backoff doubles up
// to maxRestartBackoff, and starts again at a second after a run that lasted a minute.
func (r restart) next(ran time.Duration) restart {
	if ran > time.Minute {
		r.backoff = time.Second
	}
	return restart{count: r.count + 1, backoff: r.backoff}
}

// exec replaces the process with a fresh one of the same binary, arguments and environment,
// carrying the restart state; it returns only on failure.
func (r restart) exec() error {
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envRestarts+"=") && !strings.HasPrefix(kv, envBackoff+"=") {
			env = append(env, kv)
		}
	}
	env = append(env,
		envRestarts+"="+strconv.Itoa(r.count),
		envBackoff+"="+min(2*r.backoff, maxRestartBackoff).String())
	return syscall.Exec(bin, os.Args, env) //nolint:gosec // G204: this very binary, its own arguments
}

// supervise runs run once, with the restart state of the process. When run fails and
// restartOnFailure is set, and ctx has not ended, it restarts the guard in its process after a
// backoff (exec of the same binary) and returns only if that fails. It returns the exit status.
//
// In the pod of Argo's controller a container that exits makes the pod NotReady and, exiting
// again, CrashLoopBackOff: with restartOnFailure the guard starts again in the same process
// instead, and exit_guard_ready and exit_guard_restarts_total say that it is not working. The
// probes keep answering during the backoff.
func supervise(ctx context.Context, restartOnFailure bool, log logr.Logger, run func() error) int {
	started := time.Now()
	state := restartFromEnv()
	restarts := prometheus.NewCounter(prometheus.CounterOpts{Name: "exit_guard_restarts_total",
		Help: "How many times the guard restarted in its process after a failure (--restart-on-failure)."})
	if err := metrics.Registry.Register(restarts); err != nil {
		log.Error(err, "unable to register the metrics")
		return 1
	}
	restarts.Add(float64(state.count))
	err := run()
	if err == nil || ctx.Err() != nil {
		if err != nil {
			log.Error(err, "stopped with an error")
		}
		return 0
	}
	if !restartOnFailure {
		log.Error(err, "stopped with an error")
		return 1
	}
	next := state.next(time.Since(started))
	log.Error(err, "stopped with an error: restarting", "in", next.backoff.String(), "restarts", next.count)
	select {
	case <-ctx.Done():
		return 0
	case <-time.After(next.backoff):
	}
	if err := next.exec(); err != nil {
		log.Error(err, "unable to restart")
	}
	return 1
}
