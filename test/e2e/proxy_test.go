//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// lagProxy is a plain-HTTP proxy on loopback in front of the test API server. It forwards
// every request with the test's credentials, unchanged, and delivers the events of Workflow
// watch streams late by delay, one by one and in their order: the lag an informer suffers on a
// loaded API server. Nothing is made up; every event is the API server's own.
type lagProxy struct {
	target *url.URL
	rt     http.RoundTripper
	delay  time.Duration
	srv    *http.Server
	addr   string
}

func startLagProxy(cfg *rest.Config, delay time.Duration) (*lagProxy, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &lagProxy{target: target, rt: rt, delay: delay, addr: ln.Addr().String()}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *lagProxy) Close() error { return p.srv.Close() }

// URL is where clients reach the proxy.
func (p *lagProxy) URL() string { return "http://" + p.addr }

func isWorkflowWatch(r *http.Request) bool {
	q := r.URL.Query()
	return strings.HasPrefix(r.URL.Path, "/apis/argoproj.io/") && strings.HasSuffix(r.URL.Path, "/workflows") &&
		(q.Get("watch") == "true" || q.Get("watch") == "1")
}

func (p *lagProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host, out.Host, out.RequestURI = p.target.Scheme, p.target.Host, p.target.Host, ""
	// A gzipped watch stream could not be read event by event.
	out.Header.Del("Accept-Encoding")
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
	if !isWorkflowWatch(r) || p.delay == 0 || resp.StatusCode != http.StatusOK {
		buf := make([]byte, 32*1024)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
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
	p.lag(r.Context(), w, flusher, resp.Body)
}

// lag reads watch events as they come and writes each one delay after it came.
func (p *lagProxy) lag(ctx context.Context, w io.Writer, flusher http.Flusher, body io.ReadCloser) {
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
		case <-time.After(time.Until(e.at.Add(p.delay))):
		}
		if _, err := w.Write(append(e.raw, '\n')); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
}
