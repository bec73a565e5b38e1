package journal

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

func TestRecoverAfterSIGKILL(t *testing.T) {
	t.Parallel()
	const n = 500
	for _, mode := range []string{"open", "final"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cmd := exec.CommandContext(testCtx(t), os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+mode, childDirEnv+"="+dir, childLinesEnv+"="+strconv.Itoa(n))
			stdin, err := cmd.StdinPipe()
			require.NoError(t, err)
			defer stdin.Close()
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			reported := make(chan string, 1)
			go func() {
				sc := bufio.NewScanner(stdout)
				sc.Scan()
				reported <- sc.Text()
			}()
			require.Equal(t, "appended "+strconv.Itoa(n), waitOrTimeout(t, reported))
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			var exitErr *exec.ExitError
			require.ErrorAs(t, cmd.Wait(), &exitErr)
			require.Equal(t, syscall.SIGKILL, exitErr.Sys().(syscall.WaitStatus).Signal())

			// The child recorded its first chunk before its (failing) Put.
			st, found, err := readStateFile(filepath.Join(dir, childTenant, childQuery, "1.state"))
			require.NoError(t, err)
			require.True(t, found)
			require.NotNil(t, st.Pending)
			require.Equal(t, mode == "final", st.Closed)

			store := newMemStore()
			var assembled atomic.Int64
			cfg := testConfig(t, store)
			cfg.Dir = dir
			cfg.AssembleFunc = func(ctx context.Context, tenant, id string) error {
				assembled.Add(1)
				return store.assemble(ctx, tenant, id)
			}
			j := startJournal(t, cfg)
			require.NoError(t, j.WaitPersisted(testCtx(t), childTenant, childQuery))

			var want []byte
			for s := uint64(1); s <= n; s++ {
				want = append(append(want, childLine(s)...), '\n')
			}
			require.Equal(t, string(want), string(store.joined(childTenant, childQuery)), "every journaled line, in order")
			// The in-flight chunk is re-put with the child's boundaries.
			first, ok := store.get(storage.ChunkKey(childTenant, childQuery, st.Pending.First, 1))
			require.True(t, ok)
			var wantFirst []byte
			for s := st.Pending.First; s <= st.Pending.Last; s++ {
				wantFirst = append(append(wantFirst, childLine(s)...), '\n')
			}
			require.Equal(t, string(wantFirst), string(first))
			if mode == "final" {
				require.Equal(t, int64(1), assembled.Load())
				tr, _ := store.get(storage.TranscriptKey(childTenant, childQuery))
				require.Equal(t, string(want), string(tr))
			} else {
				require.Zero(t, assembled.Load(), "an unclosed log is recovered as final=false")
			}
			require.Empty(t, dirFiles(t, dir))
		})
	}
}

type rec struct {
	seq  uint64
	data string
}

func encode(recs ...rec) []byte {
	var b []byte
	for _, r := range recs {
		b = appendRecord(b, r.seq, []byte(r.data))
	}
	return b
}

func joinLines(recs ...rec) string {
	var s string
	for _, r := range recs {
		s += r.data + "\n"
	}
	return s
}

// writeLog writes a WAL (and a state file unless st is nil) for acme/q1
// attempt 1 under dir, as a crashed process would have left them.
func writeLog(t *testing.T, dir string, wal []byte, st *logState) (walPath string) {
	t.Helper()
	qdir := filepath.Join(dir, "acme", "q1")
	require.NoError(t, os.MkdirAll(qdir, 0o700))
	walPath = filepath.Join(qdir, "1.wal")
	require.NoError(t, os.WriteFile(walPath, wal, 0o600))
	if st != nil {
		st.V, st.Tenant, st.ID, st.Attempt = stateVersion, "acme", "q1", 1
		require.NoError(t, writeStateFile(filepath.Join(qdir, "1.state"), *st, false))
	}
	return walPath
}

func TestRecoverRepairsWAL(t *testing.T) {
	t.Parallel()
	r1, r2, r3, r4 := rec{1, `{"a":1}`}, rec{2, `{"b":2}`}, rec{3, `{"c":3}`}, rec{4, `{"d":4}`}
	valid := encode(r1, r2, r3)

	type testBundle struct {
		mem   *memStore
		store *flaky
		j     *Journal
	}
	// setup starts a journal on a directory holding wal, with storage down
	// so the repaired file can be inspected before it is flushed.
	setup := func(t *testing.T, wal []byte) (*testBundle, string) {
		t.Helper()
		b := &testBundle{mem: newMemStore()}
		b.store = newFlaky(b.mem)
		b.store.setDown(true)
		cfg := testConfig(t, b.store)
		cfg.Test.SleepFunc = b.store.sleep
		walPath := writeLog(t, cfg.Dir, wal, &logState{})
		b.j = startJournal(t, cfg)
		return b, walPath
	}
	finish := func(t *testing.T, b *testBundle) {
		t.Helper()
		b.store.setDown(false)
		require.NoError(t, b.j.WaitPersisted(testCtx(t), "acme", "q1"))
	}

	t.Run("TornTailTruncated", func(t *testing.T) {
		t.Parallel()
		torn := append(append([]byte{}, valid...), encode(r4)[:headerSize+3]...)
		b, walPath := setup(t, torn)
		got, err := os.ReadFile(walPath)
		require.NoError(t, err)
		require.Equal(t, valid, got, "only the torn record is cut")
		lines, _ := b.j.Backlog()
		require.Equal(t, int64(3), lines)
		finish(t, b)
		require.Equal(t, joinLines(r1, r2, r3), string(b.mem.joined("acme", "q1")))
	})
	t.Run("CorruptTailTruncated", func(t *testing.T) {
		t.Parallel()
		bad := append(append([]byte{}, valid...), encode(r4)...)
		bad[len(bad)-1] ^= 0xff
		b, walPath := setup(t, bad)
		got, err := os.ReadFile(walPath)
		require.NoError(t, err)
		require.Equal(t, valid, got)
		finish(t, b)
		require.Equal(t, joinLines(r1, r2, r3), string(b.mem.joined("acme", "q1")))
	})
	t.Run("MiddleDamageKeepsLaterRecords", func(t *testing.T) {
		t.Parallel()
		damaged := encode(r1, r2, r3, r4)
		off := len(encode(r1)) + headerSize // first data byte of r2
		damaged[off] ^= 0xff
		b, walPath := setup(t, damaged)
		got, err := os.ReadFile(walPath)
		require.NoError(t, err)
		require.Equal(t, encode(r1, r3, r4), got, "WAL rewritten with every valid record")
		finish(t, b)
		// r1 and r3 are consecutive no more: r3 starts a new chunk.
		require.Equal(t, joinLines(r1, r3, r4), string(b.mem.joined("acme", "q1")))
	})
	t.Run("GarbageOnly", func(t *testing.T) {
		t.Parallel()
		b, _ := setup(t, []byte("not a wal at all, just bytes"))
		finish(t, b)
		require.Empty(t, b.mem.chunks("acme", "q1"))
		require.Empty(t, dirFiles(t, b.j.cfg.Dir))
	})
}

func TestRecoverUsesStateFile(t *testing.T) {
	t.Parallel()
	recs := []rec{{1, "l1"}, {2, "l2"}, {3, "l3"}, {4, "l4"}, {5, "l5"}}
	t.Run("InFlightChunkRePutIdentically", func(t *testing.T) {
		t.Parallel()
		store := newMemStore()
		cfg := testConfig(t, store)
		writeLog(t, cfg.Dir, encode(recs...), &logState{FlushedSeq: 1, Pending: &seqRange{First: 2, Last: 3}})
		j := startJournal(t, cfg)
		require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
		require.Equal(t, []string{storage.ChunkKey("acme", "q1", 2, 1), storage.ChunkKey("acme", "q1", 4, 1)},
			store.chunks("acme", "q1"), "line 1 was already persisted; chunk 2-3 keeps its boundaries")
		v, _ := store.get(storage.ChunkKey("acme", "q1", 2, 1))
		require.Equal(t, joinLines(recs[1:3]...), string(v))
		v, _ = store.get(storage.ChunkKey("acme", "q1", 4, 1))
		require.Equal(t, joinLines(recs[3:]...), string(v))
	})
	t.Run("ClosedFinalAssembled", func(t *testing.T) {
		t.Parallel()
		store := newMemStore()
		var assembled atomic.Int64
		cfg := testConfig(t, store)
		cfg.AssembleFunc = func(context.Context, string, string) error { assembled.Add(1); return nil }
		writeLog(t, cfg.Dir, encode(recs...), &logState{FlushedSeq: 5, Closed: true, Final: true})
		j := startJournal(t, cfg)
		require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
		require.Zero(t, store.putCount(), "everything was flushed before the crash")
		require.Equal(t, int64(1), assembled.Load())
		require.Empty(t, dirFiles(t, cfg.Dir))
	})
	t.Run("StateWithoutWAL", func(t *testing.T) {
		t.Parallel()
		var assembled atomic.Int64
		cfg := testConfig(t, newMemStore())
		cfg.AssembleFunc = func(context.Context, string, string) error { assembled.Add(1); return nil }
		walPath := writeLog(t, cfg.Dir, nil, &logState{FlushedSeq: 5, Closed: true, Final: true})
		require.NoError(t, os.Remove(walPath))
		require.NoError(t, os.WriteFile(walPath+tmpSuffix, []byte("leftover"), 0o600))
		j := startJournal(t, cfg)
		require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
		require.Equal(t, int64(1), assembled.Load(), "removal was interrupted after assembly: assemble again")
		require.Empty(t, dirFiles(t, cfg.Dir))
	})
	t.Run("MissingOrDamagedStateReputsAll", func(t *testing.T) {
		t.Parallel()
		for _, damaged := range []bool{false, true} {
			store := newMemStore()
			cfg := testConfig(t, store)
			walPath := writeLog(t, cfg.Dir, encode(recs...), nil)
			if damaged {
				require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(walPath), "1.state"), []byte("{nope"), 0o600))
			}
			j := startJournal(t, cfg)
			require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
			require.Equal(t, joinLines(recs...), string(store.joined("acme", "q1")))
		}
	})
	t.Run("UnexpectedEntriesIgnored", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t, newMemStore())
		require.NoError(t, os.WriteFile(filepath.Join(cfg.Dir, "README"), []byte("x"), 0o600))
		require.NoError(t, os.MkdirAll(filepath.Join(cfg.Dir, "acme", "q1"), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(cfg.Dir, "acme", "q1", "notes.txt"), []byte("x"), 0o600))
		j := startJournal(t, cfg)
		require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
		require.Equal(t, []string{"README", "acme/q1/notes.txt"}, dirFiles(t, cfg.Dir))
	})
}

func TestRecoveredLogBlocksReopen(t *testing.T) {
	t.Parallel()
	store := newFlaky(newMemStore())
	store.setDown(true)
	cfg := testConfig(t, store)
	cfg.Test.SleepFunc = store.sleep
	writeLog(t, cfg.Dir, encode(rec{1, "x"}), &logState{})
	j := startJournal(t, cfg)
	_, err := j.Open("acme", "q1", 1)
	require.ErrorIs(t, err, ErrExists)
	_, err = os.Stat(filepath.Join(cfg.Dir, "acme", "q1", "1.wal"))
	require.False(t, errors.Is(err, os.ErrNotExist))
}
