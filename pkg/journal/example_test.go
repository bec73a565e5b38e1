package journal_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// mapStore is a minimal journal.Store.
type mapStore struct {
	mu      sync.Mutex
	objects map[string][]byte
}

func (s *mapStore) Put(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objects[key] = append([]byte(nil), value...)
	return nil
}

// A worker journals every stdout line of a query before publishing it, then
// closes the log as final; the journal persists the chunks in order and
// assembles the transcript.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "journal-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	store := &mapStore{objects: map[string][]byte{}}

	j, err := journal.New(journal.Config{
		Dir:   dir,
		Store: store,
		// Only Close flushes here, so the example's output is always one chunk.
		FlushInterval: time.Hour,
		AssembleFunc: func(_ context.Context, tenant, id string) error {
			fmt.Println("assemble", storage.TranscriptKey(tenant, id))
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	if err := j.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = j.Stop(ctx) }()

	l, err := j.Open("acme", "q1", 1)
	if err != nil {
		panic(err)
	}
	for seq, line := range []string{`{"type":"system"}`, `{"type":"assistant"}`, `{"type":"result","is_error":false}`} {
		if err := l.Append(uint64(seq+1), []byte(line)); err != nil {
			panic(err)
		}
	}
	if err := l.Close(true); err != nil {
		panic(err)
	}
	if err := j.WaitPersisted(ctx, "acme", "q1"); err != nil {
		panic(err)
	}

	store.mu.Lock()
	defer store.mu.Unlock()
	for _, key := range slices.Sorted(maps.Keys(store.objects)) {
		fmt.Println(key)
		fmt.Print(strings.ReplaceAll(string(store.objects[key]), "\n", "\n  "))
	}
	// Output:
	// assemble queries/acme/q1/transcript.ndjson
	// queries/acme/q1/chunks/00000000000000000001.000001.ndjson
	// {"type":"system"}
	//   {"type":"assistant"}
	//   {"type":"result","is_error":false}
}
