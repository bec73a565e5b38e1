// Package pprofserve serves Go's runtime profiles (net/http/pprof) for the
// worker and the dispatcher behind the --pprof flag (env FLEET_PPROF).
//
// It is off by default and has its own listener, never the /metrics one:
// profiles show command lines, goroutine stacks and heap contents, so an
// operator opts in and chooses where they are reachable (loopback is
// recommended; a non-loopback address is logged as a warning).
//
//	worker --pprof 127.0.0.1:6060
//	go tool pprof http://127.0.0.1:6060/debug/pprof/profile?seconds=30
package pprofserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
)

// AddFlag defines --pprof on fs, off by default.
func AddFlag(fs *pflag.FlagSet, addr *string) {
	fs.StringVar(addr, "pprof", "", "address to serve Go profiles on (/debug/pprof/); empty = off (env FLEET_PPROF)")
}

// Server serves /debug/pprof/.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Start listens on addr and serves the profiles in the background. An empty
// addr means off: Start returns nil, nil (and a nil *Server is safe to Stop).
func Start(addr string, log zerolog.Logger) (*Server, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("pprof server")
		}
	}()
	ev := log.Info()
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		ev = log.Warn().Str("hint", "profiles expose stacks and heap contents; prefer a loopback address")
	}
	ev.Str("addr", ln.Addr().String()).Msg("serving Go profiles on /debug/pprof/")
	return s, nil
}

// Addr is the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Stop shuts the server down. Nil-safe.
func (s *Server) Stop(ctx context.Context) error {
	if s == nil {
		return nil
	}
	return s.srv.Shutdown(ctx)
}
