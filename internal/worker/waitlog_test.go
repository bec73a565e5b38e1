package worker

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// A worker that cannot reach NATS says so with the URL (never the
// password), then again every waitRepeat with how long it has waited.
func TestWaitLogRepeatsWithURL(t *testing.T) {
	t.Parallel()
	nc, err := nats.Connect("nats://user:secret@127.0.0.1:1", nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	require.NoError(t, err)
	defer nc.Close()
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	var l waitLog
	t0 := time.Now()
	cause := errors.New("nats: no responders")
	l.warn(log, nc, cause, t0)
	l.warn(log, nc, cause, t0.Add(time.Second))
	l.warn(log, nc, cause, t0.Add(waitRepeat+time.Second))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, buf.String())
	require.Contains(t, lines[0], `"nats_url":"nats://user:xxxxx@127.0.0.1:1"`)
	require.Contains(t, lines[0], "waiting for NATS: not connected")
	require.NotContains(t, buf.String(), "secret")
	require.Contains(t, lines[1], `"waited":31000`)
}
