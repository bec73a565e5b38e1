package e2e

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/tracing"
	"github.com/agentfleet/agentfleet/pkg/tracing/tracingtest"
)

// TestTraceOfAJobWithATraceparent: a job published with a traceparent
// header runs as spans of that trace: fleet.attempt under the producer's
// span, the sandbox's creation and invoke_agent under the attempt, one
// execute_tool per tool call under invoke_agent; every status carries
// the trace id. A malformed traceparent starts a new trace.
func TestTraceOfAJobWithATraceparent(t *testing.T) {
	t.Parallel()
	rcv := tracingtest.New(t)
	tr, err := tracing.StartEndpoint(context.Background(), "fleet-worker", rcv.URL, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2, Mod: func(c *worker.Config) { c.Tracing = tr }}).W)

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	publish := func(id, prompt, traceparent string) {
		b, err := json.Marshal(protocol.Job{ID: id, Prompt: prompt})
		require.NoError(t, err)
		f.PublishJob("default", b, map[string]string{protocol.HeaderMsgID: "default." + id,
			"traceparent": traceparent, "tracestate": "vendor=1"})
	}
	publish("traced-1", "/standin tool=busy toolfor=50ms", "00-"+traceID+"-"+parentID+"-01")
	publish("traced-2", "hello", "00-not-a-traceparent")
	r := f.Follow("default", "traced-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, traceID, r.Final.TraceID)
	for _, ev := range r.Statuses {
		if ev.State != protocol.StateQueued {
			require.Equal(t, traceID, ev.TraceID, "status %s", ev.State)
		}
	}
	r2 := f.Follow("default", "traced-2", wait)
	require.Len(t, r2.Final.TraceID, 32)
	require.NotEqual(t, traceID, r2.Final.TraceID)

	// The attempt's span ends once its job message is settled, after
	// the terminal status.
	byName := map[string]tracingtest.Span{}
	fleettest.Eventually(t, wait, func() bool {
		require.NoError(t, tr.ForceFlush(context.Background()))
		for _, s := range rcv.Spans() {
			if s.TraceID == traceID {
				byName[s.Name] = s
			}
		}
		_, ok := byName["fleet.attempt"]
		return ok
	}, "the attempt's span")
	attempt := byName["fleet.attempt"]
	require.Equal(t, parentID, attempt.ParentID)
	require.Equal(t, "traced-1", attempt.Attrs["fleet.query.id"])
	require.Equal(t, attempt.SpanID, byName["fleet.sandbox.create"].ParentID)
	var agentSpan tracingtest.Span
	for name, s := range byName {
		if len(name) > len("invoke_agent ") && name[:len("invoke_agent ")] == "invoke_agent " {
			agentSpan = s
		}
	}
	require.Equal(t, attempt.SpanID, agentSpan.ParentID)
	require.Equal(t, "invoke_agent", agentSpan.Attrs["gen_ai.operation.name"])
	require.Equal(t, "anthropic", agentSpan.Attrs["gen_ai.provider.name"])
	require.NotEmpty(t, agentSpan.Attrs["gen_ai.conversation.id"])
	tool := byName["execute_tool Bash"]
	require.Equal(t, agentSpan.SpanID, tool.ParentID)
	require.Equal(t, "Bash", tool.Attrs["gen_ai.tool.name"])
	require.Contains(t, tool.Attrs["gen_ai.tool.call.id"], "toolu_standin_")
}
