package envcache_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/envcache"
)

// A failing setup names its exit status; its output up to the failure
// arrives, and sh -e stops at the first failing command.
func TestRunSetupFailureNamesTheExitStatus(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	sb, _ := f.checkout(t)
	var lines []string
	err := envcache.RunSetup(t.Context(), sb, "", "echo one\necho two >&2\nfalse\necho never", func(l string) { lines = append(lines, l) })
	var se *envcache.SetupError
	require.True(t, errors.As(err, &se), "%v", err)
	require.Equal(t, 1, se.Code)
	require.Equal(t, "setup exited with status 1", err.Error())
	require.Equal(t, []string{"one", "two"}, lines)

	lines = nil
	err = envcache.RunSetup(t.Context(), sb, "", "printf 'a\\nno newline'; exit 3", func(l string) { lines = append(lines, l) })
	require.ErrorContains(t, err, "status 3")
	require.Equal(t, []string{"a", "no newline"}, lines)
}

// A setup that hangs is stopped when its context ends (the job's timeout).
func TestRunSetupIsBoundedByItsContext(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	sb, _ := f.checkout(t)
	ctx, cancel := context.WithCancel(t.Context())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- envcache.RunSetup(ctx, sb, "", "echo started\nsleep 600", func(string) { close(started) })
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		var se *envcache.SetupError
		require.True(t, errors.As(err, &se), "%v", err)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "setup did not finish")
	case <-time.After(time.Minute):
		t.Fatal("the setup was not stopped")
	}
}
