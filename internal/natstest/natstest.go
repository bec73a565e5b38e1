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
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ReadyTimeout bounds how long a server may take to accept connections
// (generous: JetStream recovery on a loaded 2-core CI machine is slow).
const ReadyTimeout = time.Minute

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
	return connect(t, srv.ClientURL(), opts)
}

// connect is Connect to urls (comma-separated).
func connect(t testing.TB, urls string, opts []nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
	}, opts...)
	nc, err := nats.Connect(urls, all...)
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

// APIRelay returns a JetStream context on nc whose API requests go through
// a relay on core NATS (API prefix "relay"), so a test can inject the
// answers a cluster gives: intercept sees each request with its API
// subject (after "$JS.API.") and returns true when it has answered or
// dropped it; every other request, and a KV put sent under the prefix, goes
// to the real server, headers included, and its reply back.
func APIRelay(t testing.TB, nc *nats.Conn, intercept func(api string, m *nats.Msg) bool) jetstream.JetStream {
	t.Helper()
	sub, err := nc.Subscribe("relay.>", func(m *nats.Msg) {
		api := strings.TrimPrefix(m.Subject, "relay.")
		if intercept(api, m) {
			return
		}
		subj := "$JS.API." + api
		if strings.HasPrefix(api, "$KV.") {
			subj = api
		}
		resp, err := nc.RequestMsg(&nats.Msg{Subject: subj, Data: m.Data, Header: m.Header}, 10*time.Second)
		if err == nil {
			_ = m.RespondMsg(&nats.Msg{Data: resp.Data, Header: resp.Header})
		}
	})
	if err != nil {
		t.Fatalf("natstest: relay: %v", err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	js, err := jetstream.NewWithAPIPrefix(nc, "relay")
	if err != nil {
		t.Fatalf("natstest: relay: %v", err)
	}
	return js
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

// FreePorts returns n TCP ports on 127.0.0.1 that were free a moment ago,
// for servers whose ports must be known before they start (cluster routes).
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	var ls []net.Listener
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("natstest: free port: %v", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}

// Cluster is a JetStream cluster of servers in the test process, each
// with its own ports and store, routed on loopback. A node can be killed
// (shut down at once) and restarted on the same ports and store.
type Cluster struct {
	t       testing.TB
	opts    []*server.Options
	mu      sync.Mutex
	servers []*server.Server
}

// ClusterOptions returns the options of an n-node cluster on loopback
// (JetStream, stores in temporary directories, routes to every node).
func ClusterOptions(t testing.TB, n int) []*server.Options {
	t.Helper()
	ports := FreePorts(t, 2*n)
	routes := make([]*url.URL, n)
	for i := range n {
		routes[i] = &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[n+i]))}
	}
	out := make([]*server.Options, n)
	for i := range n {
		out[i] = &server.Options{
			ServerName: "n" + strconv.Itoa(i+1),
			Host:       "127.0.0.1",
			Port:       ports[i],
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "fleet", Host: "127.0.0.1", Port: ports[n+i]},
			Routes:     routes,
		}
	}
	return out
}

// RunCluster starts one server per options (all at once, as routes need)
// and returns once every one accepts connections and JetStream has a meta
// leader.
func RunCluster(t testing.TB, opts []*server.Options) *Cluster {
	t.Helper()
	c := &Cluster{t: t, opts: opts, servers: make([]*server.Server, len(opts))}
	for i, o := range opts {
		o.NoSigs = true
		srv, err := server.NewServer(o.Clone())
		if err != nil {
			t.Fatalf("natstest: cluster node %d: %v", i+1, err)
		}
		c.servers[i] = srv
		go srv.Start()
	}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, srv := range c.servers {
			srv.Shutdown()
			srv.WaitForShutdown()
		}
	})
	for i, srv := range c.servers {
		if !srv.ReadyForConnections(ReadyTimeout) {
			t.Fatalf("natstest: cluster node %d not ready within %s", i+1, ReadyTimeout)
		}
	}
	c.waitMeta()
	return c
}

// waitMeta waits until JetStream has a meta leader and every node is
// current with it (creating a replicated stream before that may time out).
func (c *Cluster) waitMeta() {
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		leader, current := false, 0
		for _, srv := range c.Servers() {
			leader = leader || srv.JetStreamIsLeader()
			if srv.JetStreamIsCurrent() {
				current++
			}
		}
		if leader && current == len(c.opts) {
			return
		}
		<-tick.C
	}
	c.t.Fatalf("natstest: JetStream cluster not formed within a minute")
}

// URLs is every node's client URL, comma-separated (what a client gets).
func (c *Cluster) URLs() string {
	var urls []string
	for _, o := range c.opts {
		urls = append(urls, "nats://"+net.JoinHostPort(o.Host, strconv.Itoa(o.Port)))
	}
	return strings.Join(urls, ",")
}

// Connect opens a client connection to every node (URLs) that reconnects
// forever, as Connect does for one server, and returns it with a
// JetStream context. The connection is closed in t.Cleanup.
func (c *Cluster) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return connect(t, c.URLs(), opts)
}

// Servers are the current servers, node 1 first.
func (c *Cluster) Servers() []*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.servers)
}

// Node is the index of the node named name (a server_name), or -1.
func (c *Cluster) Node(name string) int {
	for i, o := range c.opts {
		if o.ServerName == name {
			return i
		}
	}
	return -1
}

// Kill shuts node i down at once (its clients are cut, its store stays).
func (c *Cluster) Kill(i int) {
	srv := c.Servers()[i]
	srv.Shutdown()
	srv.WaitForShutdown()
}

// Restart starts node i again on its ports and store.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	srv, err := server.NewServer(c.opts[i].Clone())
	if err != nil {
		c.t.Fatalf("natstest: restart node %d: %v", i+1, err)
	}
	c.mu.Lock()
	c.servers[i] = srv
	c.mu.Unlock()
	go srv.Start()
	if !srv.ReadyForConnections(ReadyTimeout) {
		c.t.Fatalf("natstest: node %d not ready within %s after a restart", i+1, ReadyTimeout)
	}
}
