package fleetcli

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// A parked session's status shows its turns (its result summary has no
// count of its own); a one-shot run's, the result's.
func TestSummaryTurns(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	parked := &protocol.StatusEvent{ID: "s9", Tenant: "default", State: protocol.StateParked, At: time.Now(),
		Result: &protocol.ResultSummary{LastSeq: 7}}
	parked.Turn = 2
	summary(&b, parked)
	require.Contains(t, b.String(), "turns 2")
	b.Reset()
	summary(&b, &protocol.StatusEvent{ID: "q1", Tenant: "default", State: protocol.StateSucceeded, At: time.Now(),
		Result: &protocol.ResultSummary{Subtype: "success", NumTurns: 3}})
	require.Contains(t, b.String(), "turns 3")
}
