package dispatcher

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// TestDeadLetterEndingIsFenced: the job's last delivery is still running
// when it is dead-lettered, and its worker writes the query's terminal
// status between the dispatcher reading the status and ending the query.
// The query must keep exactly one terminal status: the worker's.
func TestDeadLetterEndingIsFenced(t *testing.T) {
	svc, c := newService(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, svc.Start(ctx))
	n := svc.names
	status := func(state protocol.State) {
		b, err := json.Marshal(protocol.StatusEvent{V: protocol.SchemaVersion, ID: "q1", Tenant: "default", State: state, Attempt: 5, JobSeq: 7, Worker: "w1", At: time.Now().UTC()})
		require.NoError(t, err)
		_, err = c.js.Publish(ctx, n.QueryStatus("default", "q1"), b)
		require.NoError(t, err)
	}
	status(protocol.StateRunning)
	svc.dead.testBeforeEnd = func() {
		svc.dead.testBeforeEnd = nil
		status(protocol.StateSucceeded) // the worker finishes in the window
	}
	require.NoError(t, svc.dead.endQuery(ctx, "default", "q1", 5, 7))

	qs, err := c.js.Stream(ctx, n.QueriesStream())
	require.NoError(t, err)
	oc, err := qs.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{n.QueryStatus("default", "q1")}})
	require.NoError(t, err)
	batch, err := oc.FetchNoWait(100)
	require.NoError(t, err)
	var terminal []protocol.State
	for m := range batch.Messages() {
		var ev protocol.StatusEvent
		require.NoError(t, json.Unmarshal(m.Data(), &ev))
		if ev.State.Terminal() {
			terminal = append(terminal, ev.State)
		}
	}
	require.NoError(t, batch.Error())
	require.Equal(t, []protocol.State{protocol.StateSucceeded}, terminal, "exactly one terminal status, the worker's")
}
