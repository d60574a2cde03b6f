package main

import (
	"strings"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// firstStartSink passes every log line through, but for the errors the certificate rotator
// (cert-controller, logger "cert-rotation") logs on every normal first start and then retries
// on its own: two replicas writing the same Secret (a resourceVersion conflict, or a create
// that the other won) and the Secret read before its first write ("not well-formed, missing
// ca.crt"). Those are said at info level as what they are, retried, with the reason and no
// stack trace; anyone grepping a healthy start for errors finds none. A guard that stays
// unready says why on its own ("not ready", probes.go).
type firstStartSink struct {
	logr.LogSink
	name string
}

// newLogger wraps l's sink in a firstStartSink.
func newLogger(l logr.Logger) logr.Logger {
	sink := l.GetSink()
	if sink == nil {
		return l
	}
	if d, ok := sink.(logr.CallDepthLogSink); ok {
		sink = d.WithCallDepth(1) // the frame of firstStartSink's own methods
	}
	return l.WithSink(firstStartSink{LogSink: sink})
}

// WithName implements logr.LogSink, keeping the full name.
func (s firstStartSink) WithName(name string) logr.LogSink {
	full := name
	if s.name != "" {
		full = s.name + "." + name
	}
	return firstStartSink{LogSink: s.LogSink.WithName(name), name: full}
}

// WithValues implements logr.LogSink.
func (s firstStartSink) WithValues(kv ...any) logr.LogSink {
	return firstStartSink{LogSink: s.LogSink.WithValues(kv...), name: s.name}
}

// WithCallDepth implements logr.CallDepthLogSink.
func (s firstStartSink) WithCallDepth(depth int) logr.LogSink {
	if d, ok := s.LogSink.(logr.CallDepthLogSink); ok {
		return firstStartSink{LogSink: d.WithCallDepth(depth), name: s.name}
	}
	return s
}

// Error implements logr.LogSink.
func (s firstStartSink) Error(err error, msg string, kv ...any) {
	if s.name == "cert-rotation" && retriedAtStart(err) {
		s.Info(0, msg+": retried", append(kv, "reason", err.Error())...)
		return
	}
	s.LogSink.Error(err, msg, kv...)
}

// retriedAtStart says whether err is one the rotator meets on a normal first start and retries.
func retriedAtStart(err error) bool {
	if err == nil {
		return false
	}
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) ||
		strings.Contains(err.Error(), "not well-formed, missing")
}
