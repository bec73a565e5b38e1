package e2e

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// The dispatcher reads each status event with one consumer, its status
// index, which hands the events to its other readers (spend, parked
// sessions), and the archiver with its own: the server delivers and
// tracks the acks of each event twice, not four times. Spend
// is still counted exactly once per result.
func TestStatusEventsReadByTwoConsumers(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 4})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, w.W)
	for _, id := range []string{"c1", "c2", "c3"} {
		f.SubmitJSON("payer", id, "/standin cost=0.25")
	}
	for _, id := range []string{"c1", "c2", "c3"} {
		require.Equal(t, protocol.StateSucceeded, f.Follow("payer", id, wait).Final.State)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := f.JS.Stream(ctx, f.Names.QueriesStream())
	require.NoError(t, err)
	var readers []string
	for ci := range st.ListConsumers(ctx).Info() {
		if ci.Config.FilterSubject == f.Names.StatusWildcard() || slices.Contains(ci.Config.FilterSubjects, f.Names.StatusWildcard()) {
			readers = append(readers, ci.Name)
		}
	}
	slices.Sort(readers)
	require.Equal(t, []string{"archiver", "dispatcher-status"}, readers)

	// Every event handled (acked), then the spend is exactly the three costs.
	idx, err := st.Consumer(ctx, "dispatcher-status")
	require.NoError(t, err)
	fleettest.Eventually(t, wait, func() bool {
		ci, err := idx.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	}, "the status index to handle every event")
	kv, err := f.JS.KeyValue(ctx, f.Names.AdmissionBucket())
	require.NoError(t, err)
	key := "spend.payer." + strconv.FormatInt(admission.WindowStart(time.Now(), 24*time.Hour).Unix(), 10)
	e, err := kv.Get(ctx, key)
	require.NoError(t, err)
	v, err := strconv.ParseFloat(string(e.Value()), 64)
	require.NoError(t, err)
	require.InDelta(t, 0.75, v, 1e-9, "each result's cost counted once")
}
