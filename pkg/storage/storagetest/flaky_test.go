package storagetest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

// plainStore hides Mem's optional interfaces, to test Flaky's emulation.
type plainStore struct{ storage.Store }

func TestFlakyExerciseWhileUp(t *testing.T) {
	t.Parallel()
	storagetest.Exercise(t, func(t *testing.T) storage.Store {
		return storagetest.NewFlaky(storagetest.NewMem())
	}, storagetest.Features{})
}

func TestFlakyExerciseEmulatedOverPlainStore(t *testing.T) {
	t.Parallel()
	storagetest.Exercise(t, func(t *testing.T) storage.Store {
		return storagetest.NewFlaky(plainStore{storagetest.NewMem()})
	}, storagetest.Features{NonAtomicCreate: true})
}

func TestFlakyDownFailsEveryCallAndSignals(t *testing.T) {
	t.Parallel()
	m := storagetest.NewMem()
	f := storagetest.NewFlaky(m)
	ctx := t.Context()
	require.NoError(t, f.Put(ctx, "k", []byte("v1")))

	f.SetDown(true)
	require.ErrorIs(t, f.Put(ctx, "k", []byte("v2")), storage.ErrUnavailable)
	waitSignal(t, f.Failed())
	_, err := f.Get(ctx, "k")
	require.ErrorIs(t, err, storage.ErrUnavailable)
	_, err = f.List(ctx, "")
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.ErrorIs(t, f.Delete(ctx, "k"), storage.ErrUnavailable)
	require.ErrorIs(t, f.Create(ctx, "n", nil), storage.ErrUnavailable)
	require.ErrorIs(t, f.PutStream(ctx, "n", strings.NewReader("x")), storage.ErrUnavailable)
	require.Equal(t, 6, f.Failures())

	v, err := m.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []byte("v1"), v, "a call while down must not reach the inner store")

	f.SetDown(false)
	require.NoError(t, f.Put(ctx, "k", []byte("v3")))
	require.Equal(t, 8, f.Calls())
}

func TestFlakyFailNextFailsExactlyN(t *testing.T) {
	t.Parallel()
	f := storagetest.NewFlaky(storagetest.NewMem())
	ctx := t.Context()
	f.FailNext(2)
	require.ErrorIs(t, f.Put(ctx, "k", nil), storage.ErrUnavailable)
	require.ErrorIs(t, f.Put(ctx, "k", nil), storage.ErrUnavailable)
	require.NoError(t, f.Put(ctx, "k", nil))
	require.Equal(t, 2, f.Failures())
	waitSignal(t, f.Failed())
	select {
	case <-f.Failed():
		t.Fatal("signals must be coalesced")
	default:
	}
}

func waitSignal(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a failed call")
	}
}
