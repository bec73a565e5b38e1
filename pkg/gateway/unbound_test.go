package gateway_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/pkg/gateway"
)

// An unbound token (a warm agent's) is refused and never forwarded until
// it is bound; bound, its calls are the run's; revoked, refused again. A
// token is bound once.
func TestUnboundTokenIsARunsOnlyOnceBound(t *testing.T) {
	t.Parallel()
	b := setup(t, usageReply(anthropicfake.Usage{InputTokens: 10, OutputTokens: 2}))
	token, base := b.gw.OpenUnbound()
	require.Equal(t, b.gw.URL(), base)
	resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(false))
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	readAll(t, resp)
	require.Empty(t, b.fake.Requests(), "an unbound token's request reached the upstream")

	require.NoError(t, b.gw.Bind(token, gateway.RunInfo{Tenant: "acme", QueryID: "q-warm", Attempt: 1}))
	require.ErrorIs(t, b.gw.Bind(token, gateway.RunInfo{Tenant: "other", QueryID: "q2", Attempt: 1}), gateway.ErrNotUnbound)
	resp = b.post(t, t.Context(), "/v1/messages", token, messagesBody(false))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	readAll(t, resp)
	got := waitOrTimeout(t, b.events)
	require.Equal(t, "q-warm", got.run.QueryID, "the call is metered as the bound run's")
	require.Equal(t, 1, b.gw.Revoke(token).Calls)
	resp = b.post(t, t.Context(), "/v1/messages", token, messagesBody(false))
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	readAll(t, resp)

	// Revoking a token never bound forgets it: it cannot be bound later.
	other, _ := b.gw.OpenUnbound()
	require.Equal(t, gateway.Summary{}, b.gw.Revoke(other))
	require.ErrorIs(t, b.gw.Bind(other, gateway.RunInfo{Tenant: "acme", QueryID: "q3", Attempt: 1}), gateway.ErrNotUnbound)
	require.ErrorIs(t, b.gw.Bind("made-up", gateway.RunInfo{Tenant: "acme", QueryID: "q4", Attempt: 1}), gateway.ErrNotUnbound)
}
