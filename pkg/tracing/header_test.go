package tracing

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidTraceparent(t *testing.T) {
	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	require.True(t, ValidTraceparent(good))
	for _, bad := range []string{"", "00-not-a-traceparent", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
		"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01"} {
		require.False(t, ValidTraceparent(bad), bad)
	}
	ctx, ok := WithTraceparent(context.Background(), good, "vendor=1")
	require.True(t, ok)
	tp, ts := Inject(ctx)
	require.Equal(t, good, tp)
	require.Equal(t, "vendor=1", ts)
	_, ok = WithTraceparent(context.Background(), "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "")
	require.False(t, ok, "an all-zero trace id is invalid")
	require.Equal(t, "x", HeaderValue(map[string][]string{"TraceParent": {"x"}}, HeaderTraceparent))
}

// FuzzWithTraceparent: any header pair is taken or refused, never a
// panic; what is taken re-encodes as a valid traceparent.
func FuzzWithTraceparent(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=1")
	f.Add("00-not-a-traceparent", "")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		ctx, ok := WithTraceparent(context.Background(), tp, ts)
		if !ok {
			return
		}
		out, _ := Inject(ctx)
		if !ValidTraceparent(out) {
			t.Fatalf("%q re-encoded as %q", tp, out)
		}
	})
}
