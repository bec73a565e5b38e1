package storagetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

func TestMemExercise(t *testing.T) {
	t.Parallel()
	storagetest.Exercise(t, func(t *testing.T) storage.Store {
		m := storagetest.NewMem()
		t.Cleanup(func() { _ = m.Close() })
		return m
	}, storagetest.Features{})
}

func TestMemWaitReturnsOnceWritten(t *testing.T) {
	t.Parallel()
	m := storagetest.NewMem()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got := make(chan []byte, 1)
	go func() {
		v, err := m.Wait(ctx, "a/b")
		if err == nil {
			got <- v
		}
		close(got)
	}()
	require.NoError(t, m.Put(ctx, "a/other", []byte("x")))
	require.NoError(t, m.Put(ctx, "a/b", []byte("done")))
	require.Equal(t, []byte("done"), <-got)
}

func TestMemWaitFuncWaitsForMatchingValue(t *testing.T) {
	t.Parallel()
	m := storagetest.NewMem()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, m.Put(ctx, "k", []byte("1")))
	got := make(chan []byte, 1)
	go func() {
		v, _ := m.WaitFunc(ctx, "k", func(v []byte) bool { return string(v) == "2" })
		got <- v
	}()
	require.NoError(t, m.Put(ctx, "k", []byte("2")))
	require.Equal(t, []byte("2"), <-got)
}

func TestMemWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	m := storagetest.NewMem()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := m.Wait(ctx, "never")
	require.ErrorIs(t, err, context.Canceled)
}

func TestMemClosedFails(t *testing.T) {
	t.Parallel()
	m := storagetest.NewMem()
	require.NoError(t, m.Close())
	require.NoError(t, m.Close())
	require.ErrorIs(t, m.Put(t.Context(), "k", nil), storagetest.ErrClosed)
	_, err := m.List(t.Context(), "")
	require.ErrorIs(t, err, storagetest.ErrClosed)
}
