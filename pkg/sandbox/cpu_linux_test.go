package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// TestLocalCPUTimeCountsABusyChild: the CPU a sandbox's process's child
// spends is in the sandbox's CPU time; a sleeping one adds none.
func TestLocalCPUTimeCountsABusyChild(t *testing.T) {
	t.Parallel()
	l, err := sandbox.NewLocal(sandbox.LocalConfig{Root: t.TempDir()})
	require.NoError(t, err)
	ctx := context.Background()
	sb, err := l.Create(ctx, sandbox.Spec{ID: "cpu-1"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.WithoutCancel(ctx)) })
	m, ok := sb.(sandbox.CPUMeter)
	require.True(t, ok)
	// The shell waits for its busy child, which prints once it has spun.
	p, err := sb.Start(ctx, sandbox.ProcSpec{ID: "busy", Argv: []string{"sh", "-c", "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo spun; sleep 60'"}})
	require.NoError(t, err)
	buf := make([]byte, 5)
	_, err = p.Stdout().Read(buf)
	require.NoError(t, err)
	v, err := m.CPUTime()
	require.NoError(t, err)
	require.Greater(t, v, 20*time.Millisecond)
	require.NoError(t, p.Stop(ctx, time.Second))
}
