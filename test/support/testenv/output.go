package testenv

import (
	"bytes"
	"strings"
	"sync"
)

// Output collects what a guard writes (its process output, or its logger's), safely from
// several goroutines.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// Lines returns the lines written so far that contain every one of subs.
func (o *Output) Lines(subs ...string) []string {
	var out []string
	for _, l := range strings.Split(o.String(), "\n") {
		ok := l != ""
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}
