package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// OpsDir is the folder holding the real Prometheus and Alertmanager that hack/ops-binaries.sh
// builds: $EXIT_GUARD_OPS_BIN when set, else the script's cache folder. It fails with a
// message that says how to get them when they are missing.
func OpsDir() (string, error) {
	return cachedDir("EXIT_GUARD_OPS_BIN", "ops-binaries.sh", []string{"prometheus", "alertmanager"}, func(dir, bin string) error {
		return fmt.Errorf("the day-2 suite needs a real %s, and %s has none: run 'make e2e-ops' (it builds "+
			"Prometheus and Alertmanager from Go modules, a few minutes the first time) or 'make ops-binaries'", bin, dir)
	})
}

// Tool is a tool run by a test, serving HTTP: Prometheus, Alertmanager, a part of Argo CD.
type Tool struct {
	*Process
	// Addr is its HTTP address on loopback.
	Addr string
}

// startTool runs bin with args, its output into out, and waits until GET ready on addr answers
// 200. With environ, the process has that environment instead of the test's.
func startTool(ctx context.Context, bin, addr string, args, environ []string, out io.Writer, ready string) (*Tool, error) {
	p, err := Launch(bin, args, environ, out)
	if err != nil {
		return nil, err
	}
	t := &Tool{Process: p, Addr: addr}
	if _, err := p.WaitReady(ctx, "http://"+addr+ready, 100*time.Millisecond, 60*time.Second); err != nil {
		return nil, errors.Join(err, t.Stop())
	}
	return t, nil
}

// Stop ends the tool (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (t *Tool) Stop() error {
	_ = t.Process.Stop(10 * time.Second)
	return nil
}

// StartPrometheus runs the real Prometheus of dir (OpsDir) with the configuration file config,
// its data in a folder of its own under work, on a free loopback port.
func StartPrometheus(ctx context.Context, dir, work, config string, out io.Writer) (*Tool, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(work, "prometheus-data")
	return startTool(ctx, filepath.Join(dir, "prometheus"), addr, []string{
		"--config.file=" + config, "--storage.tsdb.path=" + data, "--web.listen-address=" + addr,
		"--web.enable-lifecycle", "--log.level=warn",
	}, nil, out, "/-/ready")
}

// StartAlertmanager runs the real Alertmanager of dir with the configuration file config, on a
// free loopback port, clustering off (it binds nothing else).
func StartAlertmanager(ctx context.Context, dir, work, config string, out io.Writer) (*Tool, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	return startTool(ctx, filepath.Join(dir, "alertmanager"), addr, []string{
		"--config.file=" + config, "--storage.path=" + filepath.Join(work, "alertmanager-data"),
		"--web.listen-address=" + addr, "--cluster.listen-address=", "--log.level=warn",
	}, nil, out, "/-/ready")
}

// Sample is one series of an instant query's answer.
type Sample struct {
	Labels map[string]string
	Value  string
}

// Query runs an instant PromQL query on the Prometheus at addr.
func Query(ctx context.Context, addr, query string) ([]Sample, error) {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  []any             `json:"value"`
		} `json:"result"`
	}
	if err := promAPI(ctx, addr, "/api/v1/query", url.Values{"query": {query}}, &data); err != nil {
		return nil, fmt.Errorf("query %q: %w", query, err)
	}
	var out []Sample
	for _, r := range data.Result {
		s := Sample{Labels: r.Metric}
		if len(r.Value) == 2 {
			s.Value, _ = r.Value[1].(string)
		}
		out = append(out, s)
	}
	return out, nil
}

// Series is one series of a range query's answer: its labels, and its values that are
// numbers (not NaN) with their times (Unix seconds).
type Series struct {
	Labels map[string]string
	At, V  []float64
}

// QueryRange runs a range query on the Prometheus at addr, as Grafana's Prometheus data source
// does for a time-series panel.
func QueryRange(ctx context.Context, addr, query string, start, end time.Time, step time.Duration) ([]Series, error) {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
		} `json:"result"`
	}
	q := url.Values{"query": {query}, "start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)},
		"step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	if err := promAPI(ctx, addr, "/api/v1/query_range", q, &data); err != nil {
		return nil, fmt.Errorf("query %q: %w", query, err)
	}
	var out []Series
	for _, r := range data.Result {
		s := Series{Labels: r.Metric}
		for _, v := range r.Values {
			str, _ := v[1].(string)
			f, err := strconv.ParseFloat(str, 64)
			if at, ok := v[0].(float64); ok && err == nil && !math.IsNaN(f) {
				s.At, s.V = append(s.At, at), append(s.V, f)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// LabelValues is Prometheus's answer to Grafana's label_values(metric, label) over a range.
func LabelValues(ctx context.Context, addr, label, metric string, start, end time.Time) ([]string, error) {
	var data []string
	q := url.Values{"match[]": {metric}, "start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)}}
	if err := promAPI(ctx, addr, "/api/v1/label/"+url.PathEscape(label)+"/values", q, &data); err != nil {
		return nil, fmt.Errorf("label values of %s on %s: %w", label, metric, err)
	}
	return data, nil
}

// promAPI GETs path of Prometheus's HTTP API at addr and decodes the answer's data into data.
func promAPI(ctx context.Context, addr, path string, query url.Values, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path+"?"+query.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err
	}
	if body.Status != "success" {
		return errors.New(body.Error)
	}
	return json.Unmarshal(body.Data, data)
}

// Notification is one alert of a webhook notification from Alertmanager.
type Notification struct {
	Received    time.Time
	Status      string // firing or resolved
	Labels      map[string]string
	Annotations map[string]string
}

// Receiver is an HTTP server that keeps what Alertmanager's webhook receiver sends it.
type Receiver struct {
	URL string
	srv *http.Server
	mu  sync.Mutex
	got []Notification
}

// StartReceiver listens on a free loopback port.
func StartReceiver() (*Receiver, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	r := &Receiver{URL: "http://" + addr + "/alerts"}
	r.srv = &http.Server{Addr: addr, ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var msg struct {
			Alerts []struct {
				Status      string            `json:"status"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"alerts"`
		}
		if err := json.NewDecoder(req.Body).Decode(&msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		now := time.Now()
		r.mu.Lock()
		for _, a := range msg.Alerts {
			r.got = append(r.got, Notification{Received: now, Status: a.Status, Labels: a.Labels, Annotations: a.Annotations})
		}
		r.mu.Unlock()
	})}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// Close stops the receiver.
func (r *Receiver) Close() error { return r.srv.Close() }

// Notifications returns what was received so far.
func (r *Receiver) Notifications() []Notification {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Notification(nil), r.got...)
}

// First returns the first notification of alertname with status (firing, resolved) received
// after since, if any.
func (r *Receiver) First(alertname, status string, since time.Time) (Notification, bool) {
	for _, n := range r.Notifications() {
		if n.Labels["alertname"] == alertname && n.Status == status && !n.Received.Before(since) {
			return n, true
		}
	}
	return Notification{}, false
}
