package sandbox_test

import (
	"bufio"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
)

// TestCloudflareStdinRetriesApplyOnce: stdin writes whose answer is lost
// (the bridge applied them, then answered 503) and writes that failed with
// 503 are retried by the provider, and the process reads each line exactly
// once, in order.
func TestCloudflareStdinRetriesApplyOnce(t *testing.T) {
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	sb := b.sandbox(t, nil)
	isb, ok := sb.(sandbox.Interactive)
	require.True(t, ok)
	p, err := isb.StartInteractive(testCtx(t), sandbox.ProcSpec{ID: "p1", Argv: sandboxtest.ChildArgv("echo ready", "stdin-lines", "echo bye")})
	require.NoError(t, err)
	br := bufio.NewReader(p.Stdout())
	line := func() string {
		s, err := br.ReadString('\n')
		require.NoError(t, err)
		return s
	}
	require.Equal(t, "ready\n", line())

	b.fake.FailStdinWrites(1, true) // applied, then the answer is lost
	_, err = p.Stdin().Write([]byte("first\n"))
	require.NoError(t, err)
	require.Equal(t, "got first\n", line())

	b.fake.FailStdinWrites(2, false) // not applied: twice
	_, err = p.Stdin().Write([]byte("second\n"))
	require.NoError(t, err)
	require.Equal(t, "got second\n", line())

	require.NoError(t, p.Stdin().Close())
	require.NoError(t, p.Stdin().Close(), "a second Close does nothing")
	require.Equal(t, "bye\n", line())
	st, err := p.Wait(testCtx(t))
	require.NoError(t, err)
	require.Equal(t, 0, st.Code)
	// 2 requests for the first write, 3 for the second: the retries reached
	// the bridge, and the process saw each line once (checked above: "got
	// first" is followed by "got second", not by a second "got first").
	require.Equal(t, 5, b.fake.StdinWrites("p1"))
}
