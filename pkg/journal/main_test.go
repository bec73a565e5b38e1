package journal

import (
	"context"
	"io"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// The crash tests run this test binary as a child process that journals
// lines and is then SIGKILLed by the parent.
const (
	childEnv      = "JOURNAL_TEST_CHILD" // "open": leave the log open; "final": Close(true) it
	childDirEnv   = "JOURNAL_TEST_DIR"
	childLinesEnv = "JOURNAL_TEST_LINES"
	childTenant   = "acme"
	childQuery    = "q1"
	childChunk    = 4096
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	goleak.VerifyTestMain(m)
}

// childStore fails every Put, and closes tried at the first one: by then the
// flusher has recorded its first chunk in the state file.
type childStore struct {
	once  sync.Once
	tried chan struct{}
}

func (s *childStore) Put(context.Context, string, []byte) error {
	s.once.Do(func() { close(s.tried) })
	return storage.ErrUnavailable
}

// childLine is the line the child appends for seq (the parent expects it).
func childLine(seq uint64) []byte { return line(seq, 60+int(seq%90)) }

func runChild(mode string) int {
	n, err := strconv.Atoi(os.Getenv(childLinesEnv))
	if err != nil {
		return 2
	}
	store := &childStore{tried: make(chan struct{})}
	j, err := New(Config{
		Dir:        os.Getenv(childDirEnv),
		Store:      store,
		ChunkBytes: childChunk,
		Test: TestConfig{SleepFunc: func(ctx context.Context, _ time.Duration) error {
			<-ctx.Done()
			return ctx.Err()
		}},
	})
	if err != nil {
		return 3
	}
	if err := j.Start(context.Background()); err != nil {
		return 4
	}
	l, err := j.Open(childTenant, childQuery, 1)
	if err != nil {
		return 5
	}
	for s := uint64(1); s <= uint64(n); s++ {
		if err := l.Append(s, childLine(s)); err != nil {
			return 6
		}
	}
	if mode == "final" {
		if err := l.Close(true); err != nil {
			return 7
		}
	}
	<-store.tried
	if _, err := os.Stdout.WriteString("appended " + strconv.Itoa(n) + "\n"); err != nil {
		return 8
	}
	// Wait to be killed; the parent keeps stdin open.
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 9
}
