package testenv

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// APIProxy is a plain-HTTP proxy on loopback between a guard and the test API server. It
// forwards every request with the test's credentials, and injects the faults a loaded API
// server shows its clients: reads of single workflows (isSingleRead) that hang until the
// client gives up, and Workflow watch streams that stall (events held back) or are cut.
type APIProxy struct {
	target *url.URL
	rt     http.RoundTripper
	srv    *http.Server
	addr   string

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
}

// StartAPIProxy starts a proxy to the API server of cfg, stopped when t ends.
func StartAPIProxy(t *testing.T, cfg *rest.Config) *APIProxy {
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
	p := &APIProxy{target: target, rt: rt, addr: ln.Addr().String(), watches: map[int]context.CancelFunc{}}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() { _ = p.srv.Close() })
	return p
}

// KubeConfig reaches the proxy over plain HTTP with no credentials (the proxy adds them).
func (p *APIProxy) KubeConfig(t *testing.T) []byte {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["proxy"] = &clientcmdapi.Cluster{Server: "http://" + p.addr}
	kc.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	kc.CurrentContext = "proxy"
	out, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	return out
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
	}
	out := r.Clone(ctx)
	out.URL.Scheme, out.URL.Host, out.Host, out.RequestURI = p.target.Scheme, p.target.Host, p.target.Host, ""
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
	buf := make([]byte, 32*1024)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			// A stalled watch holds its events back; they are lost if the stream is cut.
			for workflowWatch && p.Stall.Load() && ctx.Err() == nil {
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
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
