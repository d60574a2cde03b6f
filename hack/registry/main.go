// Command registry serves an OCI registry, in memory, on loopback: where `make
// release-snapshot` pushes, signs and verifies what the release workflow publishes to ghcr.io.
// It writes its address (host:port) to --addr-file once it listens, and serves until killed.
//
//	go run ./hack/registry --addr-file bin/release/registry.addr
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "The loopback address to listen on (port 0: any free port).")
	addrFile := flag.String("addr-file", "", "Where to write the address it listens on.")
	verbose := flag.Bool("v", false, "Log every request to stderr.")
	flag.Parse()
	logs := io.Discard
	if *verbose {
		logs = os.Stderr
	}
	if err := serve(*addr, *addrFile, log.New(logs, "registry: ", log.LstdFlags)); err != nil {
		fmt.Fprintln(os.Stderr, "registry:", err)
		os.Exit(1)
	}
}

func serve(addr, addrFile string, logger *log.Logger) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s is not a loopback address: the registry has no authentication", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if addrFile != "" {
		if err := os.WriteFile(addrFile, []byte(l.Addr().String()+"\n"), 0o600); err != nil {
			return err
		}
	}
	srv := &http.Server{
		Handler:           registry.New(registry.Logger(logger)),
		ReadHeaderTimeout: 10 * time.Second,
	}
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
