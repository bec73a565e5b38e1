package tenancy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
)

func TestMain(m *testing.M) { fleettest.MainNoLeaks(m) }

// setup is an auth directory and a nats-server started from the
// nats-auth.conf it generated, included as the docs say.
type setup struct {
	t   testing.TB
	Dir *tenancy.Dir
	Srv *server.Server
}

func newSetup(t testing.TB) *setup {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth")
	require.NoError(t, tenancy.Init(path, tenancy.InitOptions{}))
	return serveDir(t, path)
}

// serveDir starts a server on the setup in path.
func serveDir(t testing.TB, path string) *setup {
	t.Helper()
	d, err := tenancy.Open(path)
	require.NoError(t, err)
	// Beside the auth directory: nats-server reads an include relative to
	// the including file.
	conf := filepath.Join(filepath.Dir(path), "nats-server.conf")
	require.NoError(t, os.WriteFile(conf, fmt.Appendf(nil, "listen: 127.0.0.1:-1\njetstream { store_dir: %q }\ninclude ./auth/%s\n",
		t.TempDir(), tenancy.ConfFile), 0o600))
	opts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	require.True(t, srv.ReadyForConnections(time.Minute))
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return &setup{t: t, Dir: d, Srv: srv}
}

// creds writes tenant's new creds file and returns its path.
func (s *setup) creds(tenant string, ttl time.Duration) string {
	s.t.Helper()
	m, err := s.Dir.TenantCreds(tenant, ttl)
	require.NoError(s.t, err)
	path := filepath.Join(s.t.TempDir(), tenant+".creds")
	require.NoError(s.t, os.WriteFile(path, m.Creds, 0o600))
	return path
}

// connect connects with a creds file; async errors (permission
// violations) go to errs when given.
func (s *setup) connect(creds string, errs chan<- error, opts ...nats.Option) *nats.Conn {
	s.t.Helper()
	opts = append(opts, nats.UserCredentials(creds), nats.MaxReconnects(0), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errs != nil {
			select {
			case errs <- err:
			default:
			}
		}
	}))
	nc, err := nats.Connect(s.Srv.ClientURL(), opts...)
	require.NoError(s.t, err)
	s.t.Cleanup(nc.Close)
	return nc
}

// role connects as one of the fleet's roles, with its inbox prefix.
func (s *setup) role(file, role string) *nats.Conn {
	return s.connect(filepath.Join(s.Dir.Path, file), nil, nats.CustomInboxPrefix("_INBOX_"+role))
}

// fleetConnect is fleettest's Connect for this setup's creds.
func (s *setup) fleetConnect(_ testing.TB, role string) *nats.Conn {
	switch role {
	case "dispatcher":
		return s.role(tenancy.DispatcherFile, "dispatcher")
	case "worker":
		return s.role(tenancy.WorkerFile, "worker")
	default:
		return s.role(tenancy.AdminFile, "client")
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// jsOf is nc's JetStream API (the default prefix).
func jsOf(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(3*time.Second))
	require.NoError(t, err)
	return js
}
