package main

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// TestServeStartsAndStops: `dispatcher serve` builds and starts its
// services (the dispatcher with its API, the archiver), answers the API,
// and on SIGTERM stops them and exits 0.
func TestServeStartsAndStops(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	p := start(t, srv.ClientURL(), "serve", "--storage", "file://"+filepath.Join(t.TempDir(), "data"), "--log-level", "info")
	p.Expect(t, "dispatcher serving")

	nc, _ := natstest.Connect(t, srv)
	c, err := fleetapi.NewClient(nc, protocol.NewNames(""))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	sub, err := c.Submit(ctx, protocol.Job{ID: "q1", Prompt: "hi"})
	require.NoError(t, err)
	require.Nil(t, sub.Error)
	require.Equal(t, "q1", sub.ID)
	st, err := c.Status(ctx, protocol.QueryRef{ID: "q1"})
	require.NoError(t, err)
	require.Nil(t, st.Error)
	require.Equal(t, protocol.StateQueued, st.Status.State, "the API answers from the status the dispatcher wrote")

	p.Signal(t, syscall.SIGTERM)
	code, _, errOut := p.Wait(t)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "shutting down")
}
