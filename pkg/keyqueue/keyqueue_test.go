package keyqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/pkg/keyqueue"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestNewestPerKeyOldestKeyFirst: while the worker is busy, a second
// request of a key replaces the first in its place, and keys are served
// in the order first asked.
func TestNewestPerKeyOldestKeyFirst(t *testing.T) {
	var q keyqueue.Queue[int]
	type got struct {
		key string
		v   int
	}
	ran := make(chan got, 10)
	release := make(chan struct{})
	require.NoError(t, q.Start(context.Background(), func(_ context.Context, key string, v int) {
		ran <- got{key, v}
		if key == "busy" {
			<-release
		}
	}))
	require.True(t, q.Put("busy", 0))
	require.Equal(t, got{"busy", 0}, <-ran)
	q.Put("a", 1)
	q.Put("b", 1)
	q.Put("a", 2)
	close(release)
	require.Equal(t, got{"a", 2}, <-ran)
	require.Equal(t, got{"b", 1}, <-ran)
	require.NoError(t, q.Stop(context.Background()))
	select {
	case g := <-ran:
		t.Fatalf("ran %v after the queue was served", g)
	default:
	}
}

// TestStopCancelsTheItemUnderWayAndDropsTheRest: Stop cancels run's
// context, waits for it, drops what waits, and Put is refused before Start
// and after Stop.
func TestStopCancelsTheItemUnderWayAndDropsTheRest(t *testing.T) {
	var q keyqueue.Queue[struct{}]
	require.False(t, q.Put("early", struct{}{}), "a Put before Start")
	started, cancelled := make(chan string, 4), make(chan struct{})
	require.NoError(t, q.Start(context.Background(), func(ctx context.Context, key string, _ struct{}) {
		started <- key
		<-ctx.Done()
		close(cancelled)
	}))
	q.Put("one", struct{}{})
	require.Equal(t, "one", <-started)
	q.Put("two", struct{}{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, q.Stop(ctx))
	<-cancelled
	require.False(t, q.Put("late", struct{}{}), "a Put after Stop")
	select {
	case k := <-started:
		t.Fatalf("%s ran after Stop", k)
	default:
	}
}
