// Package natstest runs a real nats-server with JetStream inside the test
// process, so JetStream code is tested against the real thing, never a mock.
//
// Every server listens on a random localhost port, keeps its JetStream store
// in a t.TempDir(), logs nothing, ignores signals, and is shut down (and
// waited for) in t.Cleanup; connections made here are closed before their
// server. Restart brings a server back on the same port and store, so
// clients reconnect to it and find their streams: that is how outage tests
// take NATS away and give it back.
//
// This package is for tests only (it links nats-server); production code must
// not import it.
package natstest

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ReadyTimeout bounds how long a server may take to accept connections.
const ReadyTimeout = 10 * time.Second

// Option changes the server's options before it starts.
type Option func(*server.Options)

// WithMaxPayload sets the server's max_payload (the largest message), for
// tests of lines too large for one NATS message.
func WithMaxPayload(n int32) Option {
	return func(o *server.Options) { o.MaxPayload = n }
}

// WithoutJetStream starts a core-NATS-only server.
func WithoutJetStream() Option {
	return func(o *server.Options) { o.JetStream = false }
}

// started remembers each server's options (with the port it got), for Restart.
var started sync.Map // *server.Server -> *server.Options

// RunServer starts a server with JetStream (unless an option says otherwise)
// and returns it once it accepts connections. Its URL is srv.ClientURL().
func RunServer(t testing.TB, opts ...Option) *server.Server {
	t.Helper()
	o := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
	for _, opt := range opts {
		opt(o)
	}
	srv := start(t, o)
	saved := o.Clone()
	saved.Port = srv.Addr().(*net.TCPAddr).Port
	started.Store(srv, saved)
	return srv
}

func start(t testing.TB, o *server.Options) *server.Server {
	t.Helper()
	srv, err := server.NewServer(o.Clone())
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		started.Delete(srv)
	})
	go srv.Start()
	if !srv.ReadyForConnections(ReadyTimeout) {
		t.Fatalf("natstest: server on port %d not ready within %s", o.Port, ReadyTimeout)
	}
	return srv
}

// Connect opens a client connection to srv that reconnects forever (so it
// survives Restart) and returns it with a JetStream context. The connection
// is closed in t.Cleanup.
func Connect(t testing.TB, srv *server.Server, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
	}, opts...)
	nc, err := nats.Connect(srv.ClientURL(), all...)
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}

// RunJetStream starts a JetStream server and connects to it.
func RunJetStream(t testing.TB, opts ...Option) (*server.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv := RunServer(t, opts...)
	nc, js := Connect(t, srv)
	return srv, nc, js
}

// Restart shuts srv down (if it still runs) and starts a new server with the
// same options, port and JetStream store, returning it once it accepts
// connections. Clients from Connect reconnect on their own. To hold an outage
// open, call srv.Shutdown() first and Restart later. srv must come from
// RunServer, RunJetStream or Restart.
func Restart(t testing.TB, srv *server.Server) *server.Server {
	t.Helper()
	v, ok := started.Load(srv)
	if !ok {
		t.Fatalf("natstest: restart: server not started by natstest")
	}
	o := v.(*server.Options)
	srv.Shutdown()
	srv.WaitForShutdown()
	next := start(t, o)
	started.Store(next, o)
	return next
}
