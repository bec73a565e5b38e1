// Package httpserve serves /healthz, /readyz and Prometheus /metrics.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Server is the health and metrics server.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Start listens on addr ("" or a port-0 address on 127.0.0.1:0 means off:
// Start returns nil, nil) and serves in the background. ready reports
// readiness; gatherer provides the metrics.
func Start(addr string, ready func() bool, gatherer prometheus.Gatherer, log zerolog.Logger) (*Server, error) {
	return StartWithReason(addr, func() error {
		if ready() {
			return nil
		}
		return errors.New("not ready")
	}, gatherer, log)
}

// StartWithReason is Start with a readiness check that says why it is not
// ready: /readyz answers 503 with that reason.
func StartWithReason(addr string, notReady func() error, gatherer prometheus.Gatherer, log zerolog.Logger) (*Server, error) {
	return StartWithUI(addr, notReady, gatherer, nil, log)
}

// StartWithUI is StartWithReason that also serves ui (the dashboard) at
// every other path; nil serves nothing more.
func StartWithUI(addr string, notReady func() error, gatherer prometheus.Gatherer, ui http.Handler, log zerolog.Logger) (*Server, error) {
	if addr == "" || addr == "127.0.0.1:0" || addr == "off" {
		return nil, nil
	}
	mux := http.NewServeMux()
	if ui != nil {
		mux.Handle("/", ui)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := notReady(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("http server")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("serving /healthz, /readyz, /metrics")
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
