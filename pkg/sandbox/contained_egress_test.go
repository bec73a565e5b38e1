package sandbox_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// TestContainedProxyRefusesTheWorkersLoopback: a contained agent whose
// allow list names the worker's loopback (by name and in an odd spelling)
// is refused by the egress proxy under the default deny-list, so it
// reaches no service of the worker's machine (its metrics, its NATS, the
// gateway's own port); the model forward, the one way to the gateway,
// still works. With the operator allowing loopback the same list reaches
// the server.
func TestContainedProxyRefusesTheWorkersLoopback(t *testing.T) {
	requireContained(t)
	h := newEscapeHost(t)
	p, err := egress.Parse([]byte(fmt.Sprintf(`{"allow":["localhost:%d","0x7f.1:%d","[::ffff:127.0.0.1]:%d"]}`,
		h.allowedPort, h.allowedPort, h.allowedPort)))
	require.NoError(t, err)
	probe := func(deny egress.Deny, steps ...string) []string {
		b := setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained})
		sb := b.create(t, "agent-run", nil)
		n := &sandbox.Network{Policy: p, Deny: deny, Forwards: []sandbox.Forward{{Port: 18089, To: h.allowedAddr}}}
		out, st := run(t, sb, sandbox.ProcSpec{Network: n}, steps...)
		require.Equal(t, 0, st.Code, st.StderrTail)
		return strings.Split(strings.TrimSpace(out), "\n")
	}
	ps := fmt.Sprint(h.allowedPort)
	steps := []string{"try-get http://localhost:" + ps + "/", "try-get http://0x7f.1:" + ps + "/",
		"try-get http://[::ffff:127.0.0.1]:" + ps + "/", "try-get http://127.0.0.1:18089/"}
	lines := probe(egress.Deny{}, steps...)
	require.Len(t, lines, 4)
	for _, l := range lines[:3] {
		require.True(t, strings.HasPrefix(l, "ok 403 egress proxy:"), "denied loopback reached: %s", l)
		require.Contains(t, l, "deny-list")
	}
	require.Equal(t, "ok 200 allowed-body", lines[3], "the model forward still works")

	loopback, err := egress.ParseAllow("127.0.0.0/8")
	require.NoError(t, err)
	lines = probe(loopback, steps[:2]...)
	require.Equal(t, []string{"ok 200 allowed-body", "ok 200 allowed-body"}, lines, "the operator allowed loopback")
}
