package testenv

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a program a test runs: the guard, Prometheus, Alertmanager, a part of Argo CD, a
// load tool's watcher. Launch starts it; it ends with Stop or Kill.
type Process struct {
	name    string
	bin     string
	out     io.Writer
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{} // closed when the process has ended
	exitErr error
}

// Launch starts bin with args, its output into out. With env, the process has that environment
// instead of the test's (append to os.Environ() to add to it).
func Launch(bin string, args, env []string, out io.Writer) (*Process, error) {
	return LaunchCmd(exec.Command(bin, args...), env, out) //nolint:gosec // G204: a binary this repository built, or one of its pinned tools
}

// LaunchCmd starts cmd as Launch does: with env (nil: the test's), its output into out.
func LaunchCmd(cmd *exec.Cmd, env []string, out io.Writer) (*Process, error) {
	p := &Process{name: filepath.Base(cmd.Path), bin: cmd.Path, out: out, cmd: cmd, exited: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", p.name, err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.exited) }()
	return p, nil
}

// Again starts the same program again, with the same arguments, environment and output: as
// a Deployment restarts a container that ended.
func (p *Process) Again() (*Process, error) {
	return Launch(p.bin, p.cmd.Args[1:], p.cmd.Env, p.out)
}

// Pid is the process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Started is when it was started.
func (p *Process) Started() time.Time { return p.started }

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.exited }

// Exited returns an error when the process has ended (its exit error, or one that says so), nil
// while it runs.
func (p *Process) Exited() error {
	select {
	case <-p.exited:
		if p.exitErr != nil {
			return fmt.Errorf("%s exited: %w", p.name, p.exitErr)
		}
		return fmt.Errorf("%s exited with status 0", p.name)
	default:
		return nil
	}
}

// WaitReady polls url every interval until it answers 200, for up to timeout, and returns how
// long after the start it first did. It fails at once when the process ends.
func (p *Process) WaitReady(ctx context.Context, url string, interval, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if err := p.Exited(); err != nil {
			return 0, fmt.Errorf("%s was never ready: %w", p.name, err)
		}
		if code, err := Get(ctx, url); err == nil && code == http.StatusOK {
			return time.Since(p.started), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%s never became ready (GET %s): %w", p.name, url, ctx.Err())
		case <-p.exited:
		case <-time.After(interval):
		}
	}
}

// Get GETs url and returns the status code, the body unread.
func Get(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// Stop sends SIGTERM and waits for the process to end, killing it after grace. It returns the
// process's exit error, if any, or one that says it had to be killed.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return p.exitErr
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.exitErr
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %s of SIGTERM", p.name, grace)
	}
}

// Kill ends the process at once (SIGKILL), as a crash or an OOM kill would, and waits for it.
// It does nothing to a process that has ended.
func (p *Process) Kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// CPU is the CPU time the process has used, user and system (Linux: /proc).
func (p *Process) CPU() (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: count fields after it.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc stat: %q", s)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	// Linux reports clock ticks of 1/100 s (USER_HZ) to user space.
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}
