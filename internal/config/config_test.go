package config_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/config"
	"github.com/agentfleet/agentfleet/internal/natstest"
)

func TestRedactURLs(t *testing.T) {
	t.Parallel()
	got := config.RedactURLs("nats://worker:s3cret@n1:4222, nats://n2:4222")
	require.NotContains(t, got, "s3cret")
	require.Contains(t, got, "nats://worker:xxxxx@n1:4222")
	require.Contains(t, got, "nats://n2:4222")
}

func TestFlagsWinOverEnvironment(t *testing.T) {
	// t.Setenv: not parallel.
	t.Setenv("FLEET_SLOTS", "7")
	t.Setenv("FLEET_PREFIX", "env-prefix")
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	var c config.Common
	config.AddCommon(fs, &c, "worker")
	slots := fs.Int("slots", 4, "")
	require.NoError(t, config.Parse(fs, []string{"--prefix", "flag-prefix"}))
	require.Equal(t, 7, *slots, "the environment fills a flag not given")
	require.Equal(t, "flag-prefix", c.Prefix, "a flag given wins over the environment")
	require.Equal(t, "_INBOX_worker", c.InboxPrefix)
	require.Equal(t, "FLEET_NATS_URL", config.EnvName("nats-url"))
}

// NATS_URL, the variable the nats CLI and nats.go users set, is read when
// FLEET_NATS_URL is not: flag > FLEET_NATS_URL > NATS_URL > default.
func TestNATSURLFallsBackToTheNATSCLIsVariable(t *testing.T) {
	parse := func(args ...string) string {
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		var c config.Common
		config.AddCommon(fs, &c, "client")
		require.NoError(t, config.Parse(fs, args))
		return c.NATSURL
	}
	t.Setenv("FLEET_NATS_URL", "")
	t.Setenv("NATS_URL", "")
	require.Equal(t, "nats://127.0.0.1:4222", parse(), "the default with neither set")
	t.Setenv("NATS_URL", "nats://from-nats-url:4222")
	require.Equal(t, "nats://from-nats-url:4222", parse(), "NATS_URL when FLEET_NATS_URL is unset")
	t.Setenv("FLEET_NATS_URL", "nats://from-fleet:4222")
	require.Equal(t, "nats://from-fleet:4222", parse(), "FLEET_NATS_URL wins over NATS_URL")
	require.Equal(t, "nats://from-flag:4222", parse("--nats-url", "nats://from-flag:4222"), "the flag wins over both")
}

func TestBadEnvironmentValueIsAnError(t *testing.T) {
	t.Setenv("FLEET_SLOTS", "many")
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Int("slots", 4, "")
	err := config.Parse(fs, nil)
	require.ErrorContains(t, err, "FLEET_SLOTS")
}

// A connection the server refuses for good (wrong credentials) stops the
// service, saying why; before, it waited forever, logging only "not
// connected".
func TestStopOnClosedConnection(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t, func(o *server.Options) { o.Username, o.Password = "u1", "right" })
	url := strings.Replace(srv.ClientURL(), "nats://", "nats://u1:wrong@", 1)
	var logs bytes.Buffer
	log := zerolog.New(&syncWriter{w: &logs})
	nc, err := config.Connect(config.Common{NATSURL: url}, "test", log)
	require.NoError(t, err, "RetryOnFailedConnect: the connect itself does not fail")
	ctx, stop := context.WithCancel(context.Background())
	lost := config.StopOnClosedConnection(nc, log, stop)
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the service was not stopped")
	}
	require.ErrorIs(t, lost(), nats.ErrAuthorization)
	require.Contains(t, logs.String(), "Authorization Violation")

	// Our own Close is not a loss.
	ok, err := config.Connect(config.Common{NATSURL: strings.Replace(srv.ClientURL(), "nats://", "nats://u1:right@", 1)}, "test", log)
	require.NoError(t, err)
	ctx2, stop2 := context.WithCancel(context.Background())
	defer stop2()
	lost2 := config.StopOnClosedConnection(ok, log, stop2)
	ok.Close()
	require.NoError(t, lost2())
	require.NoError(t, ctx2.Err())
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
