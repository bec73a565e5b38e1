package storage_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Example shows the life of one query's objects on the default backend: the
// journal writes chunks, the worker assembles the transcript, and status
// records keep the newest state.
func Example() {
	dir, _ := os.MkdirTemp("", "fleet-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	s, err := storage.NewFS(dir) // what file://<dir> opens
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()

	// Journal chunks: attempt 1 wrote seqs 1-3, then attempt 2 took over at seq 3.
	_ = s.Put(ctx, storage.ChunkKey("acme", "q1", 1, 1), []byte(`{"type":"system"}`+"\n"+`{"type":"assistant"}`+"\n"+`{"type":"lost"}`+"\n"))
	_ = s.Put(ctx, storage.ChunkKey("acme", "q1", 3, 2), []byte(`{"type":"assistant"}`+"\n"+`{"type":"result"}`+"\n"))

	if err := storage.AssembleTranscript(ctx, s, "acme", "q1"); err != nil {
		fmt.Println(err)
		return
	}
	t, _ := storage.ReadTranscript(ctx, s, "acme", "q1")
	fmt.Print(string(t))

	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	_ = storage.PutStatus(ctx, s, protocol.StatusEvent{ID: "q1", Tenant: "acme", State: protocol.StateSucceeded, Attempt: 2, At: at})
	// A late event of the superseded attempt changes nothing.
	_ = storage.PutStatus(ctx, s, protocol.StatusEvent{ID: "q1", Tenant: "acme", State: protocol.StateRunning, Attempt: 1, At: at.Add(time.Minute)})
	st, _ := storage.GetStatus(ctx, s, "acme", "q1")
	fmt.Println(st.State, st.Attempt)

	keys, _ := s.List(ctx, storage.QueryPrefix("acme", "q1"))
	for _, k := range keys {
		fmt.Println(k)
	}
	// Output:
	// {"type":"system"}
	// {"type":"assistant"}
	// {"type":"assistant"}
	// {"type":"result"}
	// succeeded 2
	// queries/acme/q1/chunks/00000000000000000001.000001.ndjson
	// queries/acme/q1/chunks/00000000000000000003.000002.ndjson
	// queries/acme/q1/transcript.ndjson
}
