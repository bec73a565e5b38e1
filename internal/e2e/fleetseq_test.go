package e2e

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// A query whose last stored line is not its highest Fleet-Seq (the relay
// sent a line again, after a reconnect or a refusal, and the stream stored
// it after later lines; or stored it a second time after the duplicate
// window) is continued after its highest Fleet-Seq: a next attempt, a
// resumed session or a resubmission never reuses one. Before, the claim
// continued after the last stored line, and the next run's first lines
// took Fleet-Seqs the previous run had already stored.
func TestNextRunContinuesAfterTheHighestFleetSeq(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{DedupeWindow: time.Second})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	const id = "seq-order-1"
	f.SubmitJSON("default", id, "/standin lines=2")
	first := f.Follow("default", id, wait)
	require.Equal(t, protocol.StateSucceeded, first.Final.State)
	k := len(fleettest.RequireContiguous(t, first))

	// The line before the last is sent again and stored after the last
	// one (once the duplicate window let it in). The run's fence has moved
	// on since (its terminal status), so the copy goes without the fence's
	// expectation, which held when the relay sent it.
	st, err := f.JS.Stream(ctx, f.Names.QueriesStream())
	require.NoError(t, err)
	var again *jetstream.RawStreamMsg
	for seq := uint64(1); again == nil; seq++ {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(t, err)
		if m.Subject == f.Names.QueryMsg("default", id) && m.Header.Get(protocol.HeaderSeq) == strconv.Itoa(k-1) {
			again = m
		}
	}
	fleettest.Eventually(t, wait, func() bool {
		m := nats.NewMsg(again.Subject)
		m.Header, m.Data = nats.Header(http.Header(again.Header).Clone()), again.Data
		m.Header.Del(jetstream.ExpectedLastSubjSeqHeader)
		m.Header.Del(jetstream.ExpectedLastSubjSeqSubjHeader)
		ack, err := f.JS.PublishMsg(ctx, m)
		return err == nil && !ack.Duplicate
	}, "the line stored again")
	last, err := st.GetLastMsgForSubject(ctx, f.Names.QueryMsg("default", id))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(k-1), last.Header.Get(protocol.HeaderSeq), "the last line is not the highest Fleet-Seq")

	// The id is submitted again (past the jobs' duplicate window) and runs.
	fleettest.Eventually(t, wait, func() bool {
		rep, err := f.Client.Submit(ctx, protocol.Job{ID: id, Prompt: "/standin lines=2"})
		return err == nil && rep.Error == nil && !rep.Duplicate
	}, "the resubmission stored")
	var h fleettest.Run
	fleettest.Eventually(t, wait, func() bool {
		h = f.History("default", id)
		terminal := 0
		for _, ev := range h.Statuses {
			if ev.State.Terminal() {
				terminal++
			}
		}
		return terminal == 2
	}, "the second run ended")

	// Stream order: the first run's k lines, the line stored again, then
	// the second run's, which continue after k.
	require.Greater(t, len(h.Lines), k+1)
	for i, l := range h.Lines[k+1:] {
		require.Equal(t, uint64(k+1+i), l.Seq, "the second run's line %d", i)
	}
	seen := map[uint64]int{}
	for _, l := range h.Lines {
		seen[l.Seq]++
	}
	for seq, n := range seen {
		if seq == uint64(k-1) {
			require.Equal(t, 2, n, "the line stored again")
			continue
		}
		require.Equal(t, 1, n, "Fleet-Seq %d is stored once", seq)
	}
}
