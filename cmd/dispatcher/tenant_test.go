package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// dispatcher tenant set|get|ls|rm, and ls says why a queued job waits.
func TestCLITenantAndWaiting(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	url := f.Srv.ClientURL()
	code, out, errOut := run(t, url, "tenant", "set", "capped", "--max-running", "1", "--weight", "2")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^capped\s+1\s+2\s+-\s+-$`, out)
	code, out, errOut = run(t, url, "tenant", "set", "capped", "--budget-usd", "5", "--budget-window", "24h")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^capped\s+1\s+2\s+5\s+24h0m0s$`, out, "set changes only the flags given")
	code, out, _ = run(t, url, "tenant", "ls")
	require.Equal(t, 0, code)
	require.Regexp(t, `(?m)^TENANT\s+MAX_RUNNING\s+WEIGHT\s+BUDGET_USD\s+BUDGET_WINDOW$`, out)
	require.Contains(t, out, "capped")

	code, _, errOut = run(t, url, "tenant", "set", "capped", "--weight", "5000")
	require.Equal(t, fleetcli.ExitUsage, code)
	require.Contains(t, errOut, "weight must be between")
	code, _, errOut = run(t, url, "tenant", "set", "capped", "--weight", "NaN")
	require.Equal(t, fleetcli.ExitUsage, code, errOut)
	require.Contains(t, errOut, "weight must be a finite number")
	code, _, _ = run(t, url, "tenant", "get", "capped", "--weight", "2")
	require.Equal(t, fleetcli.ExitUsage, code, "set's flags go with set only")
	code, _, _ = run(t, url, "tenant", "get", "Bad!")
	require.Equal(t, fleetcli.ExitUsage, code)
	code, _, _ = run(t, url, "tenant", "frob", "x")
	require.Equal(t, fleetcli.ExitUsage, code)
	code, _, errOut = run(t, url, "tenant", "get", "nobody")
	require.Equal(t, fleetcli.ExitNotFound, code)
	require.Contains(t, errOut, "defaults apply")

	// No worker: the first job is admitted, the second waits for the cap.
	fleettest.Eventually(t, wait, func() bool {
		s, ok := f.Disp.Admitter().SettingsOf("capped")
		return ok && s.MaxRunning == 1
	}, "the admitter sees the cap")
	f.SubmitJSON("capped", "w1", "hi")
	f.SubmitJSON("capped", "w2", "hi")
	fleettest.Eventually(t, wait, func() bool {
		_, out, _ = run(t, url, "ls", "--tenant", "capped", "--state", "queued")
		return strings.Contains(out, "tenant_cap #1")
	}, "ls shows why w2 waits")
	require.Regexp(t, `(?m)^capped\s+w2\s+queued\s.*tenant_cap #1$`, out)

	code, _, errOut = run(t, url, "tenant", "rm", "capped")
	require.Equal(t, 0, code, errOut)
	code, _, _ = run(t, url, "tenant", "get", "capped")
	require.Equal(t, fleetcli.ExitNotFound, code)
}
