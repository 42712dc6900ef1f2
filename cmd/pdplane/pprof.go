package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/rs/zerolog"
)

// startPprof serves Go's runtime profiles (/debug/pprof/) on addr, a
// loopback address, on a listener of their own: never on the control
// plane's, where clients and peers would reach them. It returns the server
// to close at shutdown; its Addr is the address bound.
func startPprof(addr string, log zerolog.Logger) (*http.Server, error) {
	if err := checkLoopback(addr); err != nil {
		return nil, fmt.Errorf("--pprof-addr: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-addr: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info().Str("addr", hs.Addr).Msg("serving runtime profiles at /debug/pprof/")
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn().Err(err).Msg("pprof listener stopped")
		}
	}()
	return hs, nil
}

// checkLoopback refuses an address other hosts could reach.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not HOST:PORT: %w", addr, err)
	}
	if isLoopback(host) {
		return nil
	}
	return fmt.Errorf("%q is not a loopback address: profiles show the process's memory, so they are served on 127.0.0.1, ::1 or localhost only", addr)
}
