package archiver_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

func TestMain(m *testing.M) { fleettest.MainNoLeaks(m) }

// wait bounds every wait for an event (generous: `make test` runs all
// packages at once on 2 cores).
const wait = 2 * time.Minute

// TestLostWorkerTranscriptIsCompleted: a worker is SIGKILLed mid-run and
// never comes back, so the tail it journaled but had not flushed never
// reaches storage from it. Another worker finishes the query; the stored
// transcript must still hold every line the stream holds.
func TestLostWorkerTranscriptIsCompleted(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{AckWait: 2 * time.Second, ArchiveDelay: 200 * time.Millisecond})
	root := f.Objects.(*storage.FS).Root()
	lost := fleettest.StartWorkerProcess(t, f.Srv.ClientURL(), filepath.Join(t.TempDir(), "journal"), root)

	lines := make(chan *nats.Msg, 4096)
	sub, err := f.NC.ChanSubscribe(f.Names.QueryMsg("default", "lost1"), lines)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	f.SubmitJSON("default", "lost1", "/standin lines=400 delay=5ms")
	lost.Expect(t, "started lost1 1")
	for range 60 { // the run is well under way, its journal flushing
		select {
		case <-lines:
		case <-time.After(wait):
			t.Fatal("timed out waiting for the lost worker's lines")
		}
	}
	lost.Kill(t) // and never restarted

	f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	r := f.Follow("default", "lost1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Greater(t, r.Final.Attempt, 1)
	want := fleettest.JoinLines(fleettest.RequireContiguous(t, r))

	var got []byte
	// The repair's write lands before its counter moves: wait for both.
	fleettest.Eventually(t, wait, func() bool {
		got, _ = f.Objects.Get(context.Background(), storage.TranscriptKey("default", "lost1"))
		return bytes.Equal(got, want) && f.Arch.Repaired() > 0
	}, "the archiver to store the lines only the stream had, so the transcript holds every line of the stream")
}
