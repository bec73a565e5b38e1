package config_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/config"
	"github.com/agentfleet/agentfleet/internal/natstest"
)

// syncBuf is a log sink read while the connection writes it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// NATS refusing a role's own publish is logged once per subject, at
// error, naming the subject; repeats are not logged again at error.
func TestPermissionViolationLoggedOncePerSubject(t *testing.T) {
	srv := natstest.RunServer(t, natstest.WithoutJetStream(), func(o *server.Options) {
		o.Users = []*server.User{{Username: "role", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"ok.>"}}}}}
	})
	var logs syncBuf
	log := zerolog.New(&logs).Level(zerolog.InfoLevel)
	u := strings.Replace(srv.ClientURL(), "nats://", "nats://role:pw@", 1)
	nc, err := config.Connect(config.Common{NATSURL: u}, "t", log)
	require.NoError(t, err)
	defer nc.Close()
	for range 3 {
		require.NoError(t, nc.Publish("fleet.api.submit", []byte("x")))
		require.NoError(t, nc.Flush())
	}
	require.NoError(t, nc.Publish("fleet.api.status", []byte("x")))
	// The server's errors come back in order: an allowed request after
	// them round-trips once all were handled.
	sub, err := nc.SubscribeSync("ok.reply")
	require.NoError(t, err)
	require.NoError(t, nc.Publish("ok.reply", []byte("x")))
	_, err = sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "fleet.api.status") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // the async handler runs on its own goroutine
	}
	out := logs.String()
	require.Equal(t, 1, strings.Count(out, `"subject":"fleet.api.submit"`), out)
	require.Equal(t, 1, strings.Count(out, `"subject":"fleet.api.status"`), out)
	require.Contains(t, out, `"level":"error"`)
}
