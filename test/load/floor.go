package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// floorCommand runs a webhook that admits every review at once, on every path (the guard's pod,
// TaskSet and Event paths alike): the floor under any webhook's cost. Two of them, each served
// as the guard is served to the API server (TLS 1.2 at least, HTTP/1.1 only, the same
// AdmissionReview):
//
//   - floorRuntime: controller-runtime's webhook server and admission.Webhook, with a handler
//     that allows: what the guard's serving and decoding cost before any decision.
//   - floorHTTP: net/http alone, decoding only request.uid: what TLS and HTTP cost.
const floorCommand = "floor"

const (
	floorRuntime = "controller-runtime"
	floorHTTP    = "net/http"
)

// maxFloorBody bounds a review, as controller-runtime does.
const maxFloorBody = 7 << 20

// floorTLS is the guard's serving TLS: TLS 1.2 at least, and HTTP/1.1 only, as the guard
// speaks unless --enable-http2.
func floorTLS(c *tls.Config) {
	c.MinVersion = tls.VersionTLS12
	c.NextProtos = []string{"http/1.1"}
}

func runFloor(args []string) error {
	fs := flag.NewFlagSet(floorCommand, flag.ContinueOnError)
	kind := fs.String("kind", floorRuntime, "Which floor: "+floorRuntime+" or "+floorHTTP+".")
	addr := fs.String("addr", "127.0.0.1:9443", "Where to serve, over TLS.")
	certDir := fs.String("cert-dir", "", "The folder of tls.crt and tls.key.")
	probe := fs.String("probe", "127.0.0.1:0", "The address of /readyz.")
	ctx, stop, err := startChild(fs, args)
	if err != nil {
		return err
	}
	defer stop()
	host, portText, err := net.SplitHostPort(*addr)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return err
	}
	ready := func(*http.Request) error { return nil }
	var serve func() error
	switch *kind {
	case floorRuntime:
		srv := crwebhook.NewServer(crwebhook.Options{Host: host, Port: port, CertDir: *certDir, TLSOpts: []func(*tls.Config){floorTLS}})
		srv.Register("/", &admission.Webhook{Handler: admission.HandlerFunc(
			func(context.Context, admission.Request) admission.Response { return admission.Allowed("") })})
		ready = srv.StartedChecker()
		serve = func() error { return srv.Start(ctx) }
	case floorHTTP:
		mux := http.NewServeMux()
		mux.HandleFunc("/", allowReview)
		tc := &tls.Config{}
		floorTLS(tc)
		srv := &http.Server{Addr: *addr, Handler: mux, TLSConfig: tc, ReadHeaderTimeout: 5 * time.Second,
			// As controller-runtime's server: no HTTP/2 upgrade path at all.
			TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
		go func() {
			<-ctx.Done()
			_ = srv.Close()
		}()
		serve = func() error {
			err := srv.ListenAndServeTLS(filepath.Join(*certDir, "tls.crt"), filepath.Join(*certDir, "tls.key"))
			if errors.Is(err, http.ErrServerClosed) {
				return nil
			}
			return err
		}
	default:
		return fmt.Errorf("--kind %q: want %s or %s", *kind, floorRuntime, floorHTTP)
	}
	probeMux := http.NewServeMux()
	probeMux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(r); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	probeSrv := &http.Server{Addr: *probe, Handler: probeMux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = probeSrv.Close()
	}()
	go func() { _ = probeSrv.ListenAndServe() }()
	if err := serve(); err != nil {
		return fmt.Errorf("serving: %w", err)
	}
	return nil
}

// allowReview admits a review with the least decoding a webhook can do: request.uid, which the
// answer must repeat.
func allowReview(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxFloorBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var rv struct {
		APIVersion string `json:"apiVersion"`
		Request    struct {
			UID string `json:"uid"`
		} `json:"request"`
	}
	if err := json.Unmarshal(body, &rv); err != nil || rv.Request.UID == "" {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	if rv.APIVersion == "" {
		rv.APIVersion = "admission.k8s.io/v1"
	}
	uid, _ := json.Marshal(rv.Request.UID)
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"apiVersion":%q,"kind":"AdmissionReview","response":{"uid":%s,"allowed":true}}`, rv.APIVersion, uid)
}

// startFloor runs a floor webhook of kind (runFloor) in a child process on port.
func startFloor(env *testenv.Env, kind string, port int) (*process, error) {
	p, err := newProcess("do-nothing webhook ("+kind+")", env.KubeConfig())
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return p, p.start(self, floorCommand, "--kind="+kind, "--addr="+net.JoinHostPort(env.WebhookHost, strconv.Itoa(port)),
		"--cert-dir="+env.WebhookCertDir, "--probe="+p.probeAddr)
}
