package gateway_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/tracing"
	"github.com/agentfleet/agentfleet/pkg/tracing/tracingtest"
)

// TestChatSpanAndUpstreamTraceparent: a call of a run with a trace
// context is a "chat <model>" span under the run's span, with its tokens
// and status, and the upstream request carries the span's traceparent in
// the run's trace; the agent's own traceparent is not passed on.
func TestChatSpanAndUpstreamTraceparent(t *testing.T) {
	t.Parallel()
	rcv := tracingtest.New(t)
	tr, err := tracing.StartEndpoint(context.Background(), "fleet-worker", rcv.URL, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	b := setup(t, usageReply(anthropicfake.Usage{InputTokens: 40, OutputTokens: 7}), func(c *gateway.Config) { c.Tracing = tr })
	const traceID, runSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1,
		Traceparent: "00-" + traceID + "-" + runSpan + "-01"})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.gw.URL()+"/v1/messages", strings.NewReader(messagesBody(true)))
	require.NoError(t, err)
	req.Header.Set("X-Api-Key", token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-11111111111111111111111111111111-2222222222222222-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	readAll(t, resp)
	waitOrTimeout(t, b.events)
	reqs := b.fake.Requests()
	require.Len(t, reqs, 1)
	up := reqs[0].Header.Get("Traceparent")
	require.True(t, strings.HasPrefix(up, "00-"+traceID+"-"), up)

	// The call's span ends once its answer has passed.
	var chat tracingtest.Span
	for found := false; !found; {
		require.NoError(t, tr.ForceFlush(context.Background()))
		for _, s := range rcv.Spans() {
			if strings.HasPrefix(s.Name, "chat ") {
				chat, found = s, true
			}
		}
		if !found {
			waitOrTimeout(t, rcv.Received())
		}
	}
	require.Equal(t, "chat "+testModel, chat.Name)
	require.Equal(t, traceID, chat.TraceID)
	require.Equal(t, runSpan, chat.ParentID)
	require.Equal(t, "00-"+traceID+"-"+chat.SpanID+"-01", up)
	require.Equal(t, "chat", chat.Attrs["gen_ai.operation.name"])
	require.Equal(t, int64(40), chat.Attrs["gen_ai.usage.input_tokens"])
	require.Equal(t, int64(7), chat.Attrs["gen_ai.usage.output_tokens"])
	require.Equal(t, int64(200), chat.Attrs["http.response.status_code"])
}
