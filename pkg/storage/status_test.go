package storage_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func ev(state protocol.State, attempt int, sec int) protocol.StatusEvent {
	return protocol.StatusEvent{
		V: protocol.SchemaVersion, ID: qid, Tenant: tenant, State: state, Attempt: attempt,
		At: t0.Add(time.Duration(sec) * time.Second),
	}
}

func TestNewer(t *testing.T) {
	t.Parallel()
	const (
		q  = protocol.StateQueued
		r  = protocol.StateRunning
		rt = protocol.StateRetrying
		s  = protocol.StateSucceeded
		f  = protocol.StateFailed
		c  = protocol.StateCancelled
	)
	for _, tc := range []struct {
		name string
		a, b protocol.StatusEvent
		want bool
	}{
		{"higher attempt wins", ev(rt, 2, 1), ev(s, 1, 5), true},
		{"lower attempt loses even if terminal and later", ev(f, 1, 9), ev(r, 2, 1), false},
		{"terminal replaces running", ev(s, 1, 1), ev(r, 1, 2), true},
		{"running never replaces terminal", ev(r, 1, 9), ev(s, 1, 1), false},
		{"of two terminals the earlier stands", ev(c, 1, 9), ev(f, 1, 1), false},
		{"an earlier terminal replaces a later one", ev(s, 1, 1), ev(f, 1, 9), true},
		{"equal terminals: the stored one stays", ev(s, 1, 1), ev(c, 1, 1), false},
		{"non-terminal: later At wins", ev(rt, 1, 3), ev(r, 1, 2), true},
		{"non-terminal: earlier At loses", ev(r, 1, 1), ev(rt, 1, 2), false},
		{"equal At: the newcomer wins", ev(r, 1, 1), ev(q, 1, 1), true},
		{"queued (attempt 0) loses to running", ev(q, 0, 9), ev(r, 1, 1), false},
	} {
		require.Equal(t, tc.want, storage.Newer(tc.a, tc.b), tc.name)
	}
}

func TestPutStatusNeverLetsOlderEventsWin(t *testing.T) {
	t.Parallel()
	// A query's real history; whatever order the events arrive in, the
	// record ends as the last attempt's terminal event.
	history := []protocol.StatusEvent{
		ev(protocol.StateQueued, 0, 0),
		ev(protocol.StateRunning, 1, 1),
		ev(protocol.StateRetrying, 1, 2), // sandbox failed, handed back
		ev(protocol.StateRetrying, 2, 3),
		ev(protocol.StateRunning, 2, 4),
		ev(protocol.StateSucceeded, 2, 5),
		ev(protocol.StateFailed, 2, 6), // a second outcome of attempt 2: the first stands
	}
	want := history[5]
	forEachStore(t, func(t *testing.T, s storage.Store) {
		perms := permutations(len(history))
		for n, perm := range perms {
			id := fmt.Sprintf("q%d", n)
			for _, i := range perm {
				e := history[i]
				e.ID = id
				require.NoError(t, storage.PutStatus(t.Context(), s, e))
			}
			got, err := storage.GetStatus(t.Context(), s, tenant, id)
			require.NoError(t, err)
			w := want
			w.ID = id
			require.Equal(t, w, *got, "order %v", perm)
		}
	})
}

// permutations returns a spread of orders of 0..n-1: rotations and
// reversals, plus swaps of neighbours (all orders would be n! puts).
func permutations(n int) [][]int {
	var out [][]int
	for r := range n {
		p := make([]int, n)
		rev := make([]int, n)
		for i := range n {
			p[i] = (i + r) % n
			rev[n-1-i] = p[i]
		}
		out = append(out, p, rev)
	}
	for i := 0; i+1 < n; i++ {
		p := make([]int, n)
		for k := range n {
			p[k] = k
		}
		p[i], p[i+1] = p[i+1], p[i]
		out = append(out, p)
	}
	return out
}

func TestPutStatusConcurrentEventsOfOneQuery(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s storage.Store) {
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				state := protocol.StateRunning
				if i == 7 {
					state = protocol.StateSucceeded
				}
				require.NoError(t, storage.PutStatus(t.Context(), s, ev(state, 1, i)))
			})
		}
		wg.Wait()
		got, err := storage.GetStatus(t.Context(), s, tenant, qid)
		require.NoError(t, err)
		require.Equal(t, protocol.StateSucceeded, got.State)
	})
}

func TestPutStatusReplacesDamagedRecord(t *testing.T) {
	t.Parallel()
	s := storagetest.NewMem()
	require.NoError(t, s.Put(t.Context(), storage.StatusKey(tenant, qid), []byte("{not json")))
	_, err := storage.GetStatus(t.Context(), s, tenant, qid)
	require.Error(t, err)
	require.NoError(t, storage.PutStatus(t.Context(), s, ev(protocol.StateRunning, 1, 1)))
	got, err := storage.GetStatus(t.Context(), s, tenant, qid)
	require.NoError(t, err)
	require.Equal(t, protocol.StateRunning, got.State)
}

func TestStatusRejectsBadIdentity(t *testing.T) {
	t.Parallel()
	s := storagetest.NewMem()
	bad := ev(protocol.StateRunning, 1, 1)
	bad.Tenant = "UPPER"
	require.ErrorIs(t, storage.PutStatus(t.Context(), s, bad), storage.ErrInvalidKey)
	_, err := storage.GetStatus(t.Context(), s, "t", "")
	require.ErrorIs(t, err, storage.ErrInvalidKey)
	_, err = storage.ListStatus(t.Context(), s, "../x", 0)
	require.ErrorIs(t, err, storage.ErrInvalidKey)
}

func TestGetStatusMissing(t *testing.T) {
	t.Parallel()
	_, err := storage.GetStatus(t.Context(), storagetest.NewMem(), tenant, qid)
	require.ErrorIs(t, err, storage.ErrNotFound)
}

func TestListStatus(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s storage.Store) {
		ctx := t.Context()
		put := func(tn, id string, sec int) {
			e := ev(protocol.StateRunning, 1, sec)
			e.Tenant, e.ID = tn, id
			require.NoError(t, storage.PutStatus(ctx, s, e))
		}
		put("a", "old", 1)
		put("a", "new", 30)
		put("a", "mid", 10)
		put("b", "mid", 10)
		put("b", "newest", 40)
		// A damaged record and unrelated objects do not break the list.
		require.NoError(t, s.Put(ctx, storage.StatusKey("a", "broken"), []byte("garbage")))
		require.NoError(t, s.Put(ctx, storage.TranscriptKey("a", "old"), []byte("x\n")))

		ids := func(evs []protocol.StatusEvent) []string {
			var out []string
			for _, e := range evs {
				out = append(out, e.Tenant+"/"+e.ID)
			}
			return out
		}
		all, err := storage.ListStatus(ctx, s, "", 0)
		require.NoError(t, err)
		require.Equal(t, []string{"b/newest", "a/new", "a/mid", "b/mid", "a/old"}, ids(all))

		a, err := storage.ListStatus(ctx, s, "a", 0)
		require.NoError(t, err)
		require.Equal(t, []string{"a/new", "a/mid", "a/old"}, ids(a))

		top, err := storage.ListStatus(ctx, s, "", 2)
		require.NoError(t, err)
		require.Equal(t, []string{"b/newest", "a/new"}, ids(top))

		none, err := storage.ListStatus(ctx, s, "c", 0)
		require.NoError(t, err)
		require.Empty(t, none)
	})
}

func TestListStatusReportsStoreErrors(t *testing.T) {
	t.Parallel()
	m := storagetest.NewMem()
	require.NoError(t, storage.PutStatus(t.Context(), m, ev(protocol.StateRunning, 1, 1)))
	f := storagetest.NewFlaky(m)
	f.SetDown(true)
	_, err := storage.ListStatus(t.Context(), f, "", 0)
	require.ErrorIs(t, err, storage.ErrUnavailable)
	f.SetDown(false)
	f.FailNext(0)
	// List works but the Get fails.
	g := &failOnGet{Store: m, key: storage.StatusKey(tenant, qid)}
	_, err = storage.ListStatus(t.Context(), g, "", 0)
	require.ErrorIs(t, err, storage.ErrUnavailable)
}

// TestPutStatusesBatches: a batch of events, in any order and split over
// batches any way, ends with the same records as PutStatus would leave.
func TestPutStatusesBatches(t *testing.T) {
	t.Parallel()
	history := []protocol.StatusEvent{
		ev(protocol.StateQueued, 0, 0),
		ev(protocol.StateRunning, 1, 1),
		ev(protocol.StateRetrying, 2, 3),
		ev(protocol.StateSucceeded, 2, 5),
		ev(protocol.StateFailed, 2, 6),
	}
	want := history[3]
	forEachStore(t, func(t *testing.T, s storage.Store) {
		for n, perm := range permutations(len(history)) {
			id := fmt.Sprintf("b%d", n)
			var batch []protocol.StatusEvent
			for k, i := range perm {
				e := history[i]
				e.ID = id
				batch = append(batch, e)
				other := e
				other.ID = id + "x"
				batch = append(batch, other)
				if k == 2 { // two batches: the second meets stored records
					require.NoError(t, storage.PutStatuses(t.Context(), s, batch))
					batch = nil
				}
			}
			require.NoError(t, storage.PutStatuses(t.Context(), s, batch))
			for _, qid := range []string{id, id + "x"} {
				got, err := storage.GetStatus(t.Context(), s, tenant, qid)
				require.NoError(t, err)
				w := want
				w.ID = qid
				require.Equal(t, w, *got, "order %v", perm)
			}
		}
	})
	require.ErrorIs(t, storage.PutStatuses(t.Context(), storagetest.NewMem(), []protocol.StatusEvent{{ID: "../x", Tenant: tenant}}), storage.ErrInvalidKey)
}
