package tenancy_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// A session and a workspace run, driven with a tenant's creds through the
// CLI (submit, send, attach, tail, diff) on a fleet running on its own
// creds; another tenant reaches neither.
func TestCLISessionAndWorkspaceAsTenant(t *testing.T) {
	s := newSetup(t)
	f := fleettest.New(t, fleettest.Opts{Server: s.Srv, Connect: s.fleetConnect})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2}).W)
	url := s.Srv.ClientURL()
	acme, other := s.creds("acme", 0), s.creds("other", 0)
	as := func(creds, stdin string, args ...string) (int, string, string) {
		return cliIn(t, stdin, append(args, "--nats-url", url, "--nats-creds", creds)...)
	}

	code, out, errs := as(acme, "", "submit", "--session", "--id", "s1", "--idle-timeout-s", "600", "hello", "session")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	require.Equal(t, "s1\n", out)
	code, _, errs = as(acme, "", "send", "s1", "second turn")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	code, _, _ = as(other, "", "send", "s1", "from another tenant")
	require.Equal(t, fleetcli.ExitNotFound, code)
	code, _, errs = as(other, "", "attach", "s1", "--tenant", "acme")
	require.Equal(t, fleetcli.ExitUsage, code, errs)
	code, out, errs = as(acme, "third from attach\n/end\n", "attach", "s1", "--raw")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	require.Contains(t, out, "second turn")
	require.Contains(t, out, "third from attach")
	require.NotContains(t, out, "from another tenant")
	code, _, errs = as(acme, "", "tail", "s1")
	require.Equal(t, fleetcli.ExitOK, code, errs)

	repo := workspacetest.NewRepo(t, t.TempDir())
	code, out, errs = as(acme, "", "submit", "--id", "ws1", "--follow", "--repo", repo.URL, "--push", "--depth", "0", "/standin append=src/a.go")
	require.Equal(t, fleetcli.ExitOK, code, out+errs)
	code, out, errs = as(acme, "", "diff", "ws1", "--stat")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	require.Contains(t, out, "src/a.go")
	code, _, _ = as(other, "", "diff", "ws1")
	require.Equal(t, fleetcli.ExitNotFound, code)
	require.NotEmpty(t, workspacetest.Git(t, repo.Bare, "rev-parse", "fleet/acme/ws1"), "the run's branch was pushed")

	// The fleet's durables on FLEET_QUERIES are all denied to tenants by name.
	q, err := f.JS.Stream(ctxT(t, 10*time.Second), "FLEET_QUERIES")
	require.NoError(t, err)
	for name := range q.ConsumerNames(ctxT(t, 10*time.Second)).Name() {
		c, err := q.Consumer(ctxT(t, 10*time.Second), name)
		require.NoError(t, err)
		if d := c.CachedInfo().Config.Durable; d != "" {
			require.Contains(t, tenancy.FleetDurables, d, "a durable tenants may pull from by name")
		}
	}
}
