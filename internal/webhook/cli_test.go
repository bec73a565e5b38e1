package webhook_test

import (
	"bytes"
	"context"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
)

func (fx *fixture) cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	args = append(args, "--nats-url", fx.f.Srv.ClientURL())
	code := fleetcli.Run(context.Background(), args, fleetcli.IO{Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

// TestCLI: tenant webhook add prints the id and secret, ls lists the
// endpoint without it, deliveries shows each attempt, rm removes it, and
// bad input is a usage error.
func TestCLI(t *testing.T) {
	fx := newFixture(t, 2, nil)
	rc := newReceiver(t, func(_ *http.Request, n int) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	code, out, errs := fx.cli(t, "tenant", "webhook", "add", "acme", rc.srv.URL+"/hook", "--events", "succeeded")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	m := regexp.MustCompile(`(?m)^endpoint\s+(ep_\S+)\nsecret\s+(whsec_\S+)$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	id := m[1]
	rc.mu.Lock()
	rc.secret = m[2]
	rc.mu.Unlock()

	code, out, _ = fx.cli(t, "tenant", "webhook", "ls", "acme")
	require.Equal(t, fleetcli.ExitOK, code)
	require.Contains(t, out, id)
	require.Contains(t, out, rc.srv.URL+"/hook")
	require.NotContains(t, out, "whsec_")

	fx.f.SubmitJSON("acme", "cli1", "hi")
	rc.waitFor("cli1 delivered", func(h []hit) bool { return delivered(h, "query.succeeded", "cli1") })
	var rows string
	require.Eventually(t, func() bool {
		_, rows, _ = fx.cli(t, "tenant", "webhook", "deliveries", "acme", "--endpoint", id)
		return regexp.MustCompile(`HTTP 200`).MatchString(rows)
	}, wait, 50*time.Millisecond)
	require.Regexp(t, `msg_\S+\s+`+id+`\s+query.succeeded\s+cli1\s+.*HTTP 503`, rows)
	require.Regexp(t, `msg_\S+\s+`+id+`\s+query.succeeded\s+cli1\s+.*HTTP 200\s+-`, rows)

	code, _, errs = fx.cli(t, "tenant", "webhook", "add", "acme", "ftp://x.example/")
	require.Equal(t, fleetcli.ExitUsage, code)
	require.Contains(t, errs, "http:// or https://")
	code, _, errs = fx.cli(t, "tenant", "webhook", "add", "acme", "http://x.example/", "--events", "running")
	require.Equal(t, fleetcli.ExitUsage, code)
	require.Contains(t, errs, "not one of")
	code, _, _ = fx.cli(t, "tenant", "webhook", "ls")
	require.Equal(t, fleetcli.ExitUsage, code)

	code, _, errs = fx.cli(t, "tenant", "webhook", "rm", "acme", id)
	require.Equal(t, fleetcli.ExitOK, code, errs)
	code, _, _ = fx.cli(t, "tenant", "webhook", "rm", "acme", id)
	require.Equal(t, fleetcli.ExitNotFound, code)
}
