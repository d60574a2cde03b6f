package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// fakeAPIServer answers a Workflow watch with the events sent on events, one JSON object a line,
// and any other request with its path; it records the headers it was sent.
func fakeAPIServer(t *testing.T, events <-chan string) (*httptest.Server, <-chan http.Header) {
	t.Helper()
	headers := make(chan http.Header, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		headers <- r.Header.Clone()
		if !isWatch(r) {
			_, _ = fmt.Fprint(w, r.URL.Path)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case e := <-events:
				_, _ = fmt.Fprintln(w, e)
				w.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv, headers
}

// proxyURL is where a client reaches p (its kubeconfig's server).
func proxyURL(t *testing.T, p *APIProxy) string {
	t.Helper()
	kc, err := clientcmd.Load(p.KubeConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	return kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster].Server
}

const watchPath = "/apis/argoproj.io/v1alpha1/namespaces/ns/workflows?watch=true"

// watchLines opens a Workflow watch through p and sends each line it reads, with when it came.
func watchLines(ctx context.Context, t *testing.T, p *APIProxy) <-chan time.Time {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, proxyURL(t, p)+watchPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip")
	lines := make(chan time.Time, 10)
	// The proxy forwards the answer's header with its first event.
	go func() {
		defer close(lines)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		defer func() { _ = resp.Body.Close() }()
		s := bufio.NewScanner(resp.Body)
		for s.Scan() {
			lines <- time.Now()
		}
	}()
	return lines
}

func TestAPIProxyForwardsWithTheTestsCredentials(t *testing.T) {
	srv, headers := fakeAPIServer(t, nil)
	p := StartAPIProxy(t, &rest.Config{Host: srv.URL, BearerToken: "secret"})
	code, err := Get(t.Context(), proxyURL(t, p)+"/api/v1/namespaces")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET through the proxy: %d, %v", code, err)
	}
	if h := <-headers; h.Get("Authorization") != "Bearer secret" {
		t.Errorf("the API server was sent Authorization %q, want the test's credentials", h.Get("Authorization"))
	}
}

func TestAPIProxyDelaysWatchEvents(t *testing.T) {
	const delay = 300 * time.Millisecond
	events := make(chan string)
	srv, _ := fakeAPIServer(t, events)
	p := StartAPIProxyWith(t, &rest.Config{Host: srv.URL}, APIProxyOptions{WatchDelay: delay})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	lines := watchLines(ctx, t, p)
	for i := range 2 {
		sent := time.Now()
		events <- fmt.Sprintf(`{"type":"MODIFIED","object":{"n":%d}}`, i)
		at, ok := <-lines
		if !ok {
			t.Fatal("the watch ended")
		}
		if got := at.Sub(sent); got < delay {
			t.Errorf("event %d came %v after the API server sent it, want at least %v", i, got, delay)
		}
	}
}

func TestAPIProxyStallsAndCutsWatches(t *testing.T) {
	events := make(chan string)
	srv, _ := fakeAPIServer(t, events)
	p := StartAPIProxyWith(t, &rest.Config{Host: srv.URL}, APIProxyOptions{WatchDelay: time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	lines := watchLines(ctx, t, p)
	p.Stall.Store(true)
	events <- `{"type":"MODIFIED"}`
	select {
	case <-lines:
		t.Fatal("an event came through a stalled watch")
	case <-time.After(200 * time.Millisecond):
	}
	p.Stall.Store(false)
	select {
	case <-lines:
	case <-time.After(5 * time.Second):
		t.Fatal("the held event did not come once the stall was lifted")
	}
	p.CutWatches()
	select {
	case _, ok := <-lines:
		if ok {
			t.Fatal("an event came after the watch was cut")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not end when cut")
	}
}

// TestAPIProxyServesOneListFromASnapshot: after ServeListOnce the next list of workflows the
// match accepts gets the snapshot, any other list and the one after it the API server's answer;
// all are recorded with their query.
func TestAPIProxyServesOneListFromASnapshot(t *testing.T) {
	srv, _ := fakeAPIServer(t, make(chan string))
	p := StartAPIProxy(t, &rest.Config{Host: srv.URL})
	list := func(query string) string {
		t.Helper()
		resp, err := http.Get(proxyURL(t, p) + "/apis/argoproj.io/v1alpha1/namespaces/ns/workflows" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(body)
	}
	p.ServeListOnce([]byte(`{"kind":"WorkflowList","metadata":{"resourceVersion":"7"}}`), func(q url.Values) bool { return q.Get("limit") == "500" })
	if got := list("?resourceVersion=0"); got != "/apis/argoproj.io/v1alpha1/namespaces/ns/workflows" {
		t.Errorf("a list the match refuses = %q, want the API server's answer", got)
	}
	if got := list("?resourceVersion=&limit=500"); got != `{"kind":"WorkflowList","metadata":{"resourceVersion":"7"}}` {
		t.Errorf("first list after ServeListOnce = %q, want the snapshot", got)
	}
	if got := list("?resourceVersion=&limit=500"); got != "/apis/argoproj.io/v1alpha1/namespaces/ns/workflows" {
		t.Errorf("the next list = %q, want the API server's answer", got)
	}
	qs := p.ListQueries()
	if len(qs) != 3 || qs[0].Has("answered-from") || qs[1].Get("answered-from") != "snapshot" || qs[2].Has("answered-from") || !qs[1].Has("resourceVersion") || qs[0].Get("resourceVersion") != "0" {
		t.Errorf("list queries = %v, want three, the second answered from the snapshot", qs)
	}
}
