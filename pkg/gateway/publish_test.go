package gateway_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// TestJetStreamPublisherStoresOneEventPerCall runs calls through the
// gateway with the JetStream publisher on a real server: each call is one
// message on .model in the queries stream, and LastCall numbers the next
// attempt on.
func TestJetStreamPublisherStoresOneEventPerCall(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.RunJetStream(t)
	names := protocol.NewNames("")
	ctx := context.Background()
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: names.QueriesStream(), Subjects: []string{names.QueriesWildcard()}})
	require.NoError(t, err)
	last, err := gateway.LastCall(ctx, js, names, "acme", "q1")
	require.NoError(t, err)
	require.Zero(t, last.Call)

	b := setup(t, usageReply(anthropicfake.Usage{InputTokens: 10, OutputTokens: 1}), func(c *gateway.Config) {
		c.Publisher = gateway.JetStreamPublisher{JS: js, Names: names}
	})
	for attempt := 1; attempt <= 2; attempt++ {
		last, err := gateway.LastCall(ctx, js, names, "acme", "q1")
		require.NoError(t, err)
		token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: attempt, FirstCall: last.Call + 1})
		for range 2 {
			resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
			readAll(t, resp)
		}
		b.gw.Close(token)
		select {
		case <-js.PublishAsyncComplete():
		case <-t.Context().Done():
		}
	}
	cons, err := js.OrderedConsumer(ctx, names.QueriesStream(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.QueryModel("acme", "q1")}})
	require.NoError(t, err)
	for i := 1; i <= 4; i++ {
		m, err := cons.Next()
		require.NoError(t, err)
		ev, err := gateway.DecodeEvent(m.Data())
		require.NoError(t, err)
		require.Equal(t, i, ev.Call)
		require.Equal(t, (i+1)/2, ev.Attempt)
		require.Equal(t, "application/json", m.Headers().Get("Content-Type"))
	}
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.NumPending, "more than one message per call")
}
