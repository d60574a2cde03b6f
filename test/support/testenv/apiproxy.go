package testenv

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// APIProxy is a plain-HTTP proxy on loopback between a client (a guard, Argo's controller) and
// the test API server. It forwards every request with the test's credentials, and injects the
// faults a loaded API server shows its clients: reads of single workflows (isSingleRead) that
// hang until the client gives up, and Workflow watch streams that stall (events held back), are
// cut, or (APIProxyOptions.WatchDelay) deliver every event late. Nothing is made up: every event
// and every answer it forwards is the API server's own.
type APIProxy struct {
	target *url.URL
	rt     http.RoundTripper
	srv    *http.Server
	addr   string
	// watchDelay is APIProxyOptions.WatchDelay.
	watchDelay time.Duration

	// HangReads holds every read of a single workflow until its client gives up.
	HangReads atomic.Bool
	// ThrottleLists answers every LIST of workflows by name 429 with a Retry-After, as the
	// API server does while its watch cache (re)initializes.
	ThrottleLists atomic.Bool
	Throttled     atomic.Int64 // lists answered 429
	// Stall holds back the events of every Workflow watch stream.
	Stall atomic.Bool
	Hung  atomic.Int64 // reads held until their client gave up
	Lists atomic.Int64 // lists of Workflows: an informer's initial list, or its relist

	mu      sync.Mutex
	watches map[int]context.CancelFunc
	nextID  int
	// snapshot answers the next list of workflows that snapshotFor matches (ServeListOnce);
	// lists are the queries of every list of workflows, in order.
	snapshot    []byte
	snapshotFor func(url.Values) bool
	lists       []url.Values
}

// APIProxyOptions are what a proxy does from its start, beside the faults switched on and off
// through its fields.
type APIProxyOptions struct {
	// WatchDelay delivers the events of every Workflow watch stream (of the collection) late by
	// this much, one by one and in their order: the lag an informer suffers on a loaded API
	// server. With it, requests reach the API server without the client's Accept-Encoding, so
	// that a watch stream can be read event by event.
	WatchDelay time.Duration
}

// StartAPIProxy starts a proxy to the API server of cfg, stopped when t ends.
func StartAPIProxy(t *testing.T, cfg *rest.Config) *APIProxy {
	t.Helper()
	return StartAPIProxyWith(t, cfg, APIProxyOptions{})
}

// StartAPIProxyWith starts a proxy to the API server of cfg with opts, stopped when t ends (or
// by Close before).
func StartAPIProxyWith(t *testing.T, cfg *rest.Config, opts APIProxyOptions) *APIProxy {
	t.Helper()
	target, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &APIProxy{target: target, rt: rt, addr: ln.Addr().String(), watchDelay: opts.WatchDelay, watches: map[int]context.CancelFunc{}}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Close stops the proxy and ends every request in flight.
func (p *APIProxy) Close() error { return p.srv.Close() }

// KubeConfig reaches the proxy over plain HTTP with no credentials (the proxy adds them).
func (p *APIProxy) KubeConfig(t *testing.T) []byte {
	t.Helper()
	out, err := kubeConfig(&clientcmdapi.Cluster{Server: "http://" + p.addr}, &clientcmdapi.AuthInfo{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ServeListOnce answers the next list of workflows whose query match accepts (an informer's
// first LIST, or its relist) with body, a WorkflowList the test read earlier, in place of the
// API server's answer: the older snapshot a lagging watch cache serves. The client then
// watches from the snapshot's resourceVersion, and the API server sends it every change since.
func (p *APIProxy) ServeListOnce(body []byte, match func(url.Values) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.snapshot, p.snapshotFor = body, match
}

// ListQueries are the queries of the lists of workflows the proxy received, in order, and
// whether each was answered from a snapshot (ServeListOnce).
func (p *APIProxy) ListQueries() []url.Values {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lists)
}

// CutWatches ends every Workflow watch stream in flight: the client sees its watch close and
// watches again from the last resourceVersion it had.
func (p *APIProxy) CutWatches() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cancel := range p.watches {
		cancel()
	}
}

func isWorkflowPath(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/apis/argoproj.io/") && strings.Contains(r.URL.Path, "/workflows")
}

// isSingleRead says whether r reads one workflow, as the guard's live read does: a GET of the
// object, or a list of the collection by metadata.name.
func isSingleRead(r *http.Request) bool {
	if r.Method != http.MethodGet || !isWorkflowPath(r) || isWatch(r) {
		return false
	}
	return !strings.HasSuffix(r.URL.Path, "/workflows") || strings.Contains(r.URL.Query().Get("fieldSelector"), "metadata.name=")
}

func isWatch(r *http.Request) bool {
	w := r.URL.Query().Get("watch")
	return w == "true" || w == "1"
}

func (p *APIProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	workflowWatch := isWorkflowPath(r) && isWatch(r)
	if workflowWatch {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		p.mu.Lock()
		id := p.nextID
		p.nextID++
		p.watches[id] = cancel
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.watches, id)
			p.mu.Unlock()
			cancel()
		}()
	}
	if p.HangReads.Load() && isSingleRead(r) {
		p.Hung.Add(1)
		<-ctx.Done()
		return
	}
	if p.ThrottleLists.Load() && isSingleRead(r) && strings.HasSuffix(r.URL.Path, "/workflows") {
		p.Throttled.Add(1)
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"storage is (re)initializing","reason":"TooManyRequests","code":429}`))
		return
	}
	// A list is a GET of the collection, or (client-go's WatchList) a watch that starts with
	// the initial events.
	if r.Method == http.MethodGet && isWorkflowPath(r) && strings.HasSuffix(r.URL.Path, "/workflows") && !isSingleRead(r) &&
		(!isWatch(r) || r.URL.Query().Get("sendInitialEvents") == "true") {
		p.Lists.Add(1)
		q := r.URL.Query()
		p.mu.Lock()
		var snapshot []byte
		if p.snapshot != nil && !isWatch(r) && p.snapshotFor(q) {
			snapshot, p.snapshot = p.snapshot, nil
			q.Set("answered-from", "snapshot")
		}
		p.lists = append(p.lists, q)
		p.mu.Unlock()
		if snapshot != nil && !isWatch(r) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(snapshot)
			return
		}
	}
	out := r.Clone(ctx)
	out.URL.Scheme, out.URL.Host, out.Host, out.RequestURI = p.target.Scheme, p.target.Host, p.target.Host, ""
	if p.watchDelay > 0 {
		// A gzipped watch stream could not be read event by event.
		out.Header.Del("Accept-Encoding")
	}
	resp, err := p.rt.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	if p.watchDelay > 0 && workflowWatch && strings.HasSuffix(r.URL.Path, "/workflows") && resp.StatusCode == http.StatusOK {
		p.lag(ctx, w, flusher, resp.Body)
		return
	}
	buf := make([]byte, 32*1024)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			// A stalled watch holds its events back; they are lost if the stream is cut.
			if workflowWatch {
				p.hold(ctx)
			}
			if ctx.Err() != nil {
				return
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if err != nil {
			return
		}
	}
}

// hold waits while the proxy stalls watch streams, or until ctx ends (the stream cut, or its
// client gone).
func (p *APIProxy) hold(ctx context.Context) {
	for p.Stall.Load() && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// lag reads watch events as they come and writes each one watchDelay after it came (or later,
// while the proxy stalls watch streams).
func (p *APIProxy) lag(ctx context.Context, w io.Writer, flusher http.Flusher, body io.ReadCloser) {
	type event struct {
		at  time.Time
		raw json.RawMessage
	}
	events := make(chan event, 100000)
	go func() {
		defer close(events)
		dec := json.NewDecoder(body)
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return
			}
			events <- event{at: time.Now(), raw: raw}
		}
	}()
	go func() {
		<-ctx.Done()
		_ = body.Close()
	}()
	for e := range events {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(e.at.Add(p.watchDelay))):
		}
		p.hold(ctx)
		if ctx.Err() != nil {
			return
		}
		if _, err := w.Write(append(e.raw, '\n')); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
}
