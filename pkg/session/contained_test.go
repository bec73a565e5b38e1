package session_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// TestContainedSessions runs the session tests with the real CLI in
// contained sandboxes (docs/contained.md), network none: turns, interrupts,
// approvals, a resume in another sandbox from the session file, cancel.
func TestContainedSessions(t *testing.T) {
	if err := sandbox.CheckContained(); err != nil {
		t.Skipf("contained sandboxes cannot run here: %v", err)
	}
	for name, fn := range map[string]func(*testing.T){
		"TwoTurnsCarryHistory":                      TestTwoTurnsCarryHistory,
		"InterruptEndsTheTurnNotTheSession":         TestInterruptEndsTheTurnNotTheSession,
		"ApprovalsAllowAndDeny":                     TestApprovalsAllowAndDeny,
		"ResumeFromSessionFileInAnotherSandbox":     TestResumeFromSessionFileInAnotherSandbox,
		"CancelStopsTheProcessWithASyntheticResult": TestCancelStopsTheProcessWithASyntheticResult,
	} {
		t.Run(name, fn)
	}
}

// contained reports whether t runs under TestContainedSessions.
func contained(t *testing.T) bool {
	return strings.HasPrefix(t.Name(), "TestContainedSessions/")
}

// containedNetwork is network none with a forward to the fake API at
// base, and the base URL the CLI uses inside.
func containedNetwork(t *testing.T, base string) (*sandbox.Network, string) {
	t.Helper()
	u, err := url.Parse(base)
	require.NoError(t, err)
	fwd := sandbox.Forward{Port: 18080, To: u.Host}
	n := &sandbox.Network{Policy: egress.Policy{Mode: egress.None}, Forwards: []sandbox.Forward{fwd}}
	return n, "http://" + n.Reach(fwd, true)
}
