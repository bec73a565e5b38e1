package tenancy_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
)

// cli runs the dispatcher's command line in this process.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return cliIn(t, "", args...)
}

// cliIn is cli with stdin.
func cliIn(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := fleetcli.Run(ctx, args, fleetcli.IO{In: strings.NewReader(stdin), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

// An operator onboards a tenant in three commands; with its creds the CLI
// submits and tails its job on a fleet running on the fleet's creds, and
// another tenant's creds neither see it nor may name it.
func TestCLIOnboardSubmitTail(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "auth")
	code, out, errs := cli(t, "auth", "init", "--dir", dir)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, tenancy.ConfFile)
	code, _, errs = cli(t, "auth", "init", "--dir", dir)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "already holds a setup")

	s := serveDir(t, dir)
	f := fleettest.New(t, fleettest.Opts{Server: s.Srv, Connect: s.fleetConnect})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	url := s.Srv.ClientURL()

	acme, other := filepath.Join(root, "acme.creds"), filepath.Join(root, "other.creds")
	code, _, errs = cli(t, "tenant", "creds", "acme", "--dir", dir, "--out", acme, "--nats-url", url)
	require.Equal(t, 0, code, errs)
	require.Contains(t, errs, tenancy.JSAPIPrefix)
	code, out, errs = cli(t, "tenant", "creds", "other", "--dir", dir, "--ttl", "1h", "--nats-url", url)
	require.Equal(t, 0, code, errs)
	require.NoError(t, os.WriteFile(other, []byte(out), 0o600))
	code, out, _ = cli(t, "tenant", "token", "acme", "--dir", dir)
	require.Equal(t, 0, code)
	got, err := tenancy.VerifyToken(dir, strings.TrimSpace(out))
	require.NoError(t, err)
	require.Equal(t, "acme", got)

	as := func(creds string, args ...string) (int, string, string) {
		return cli(t, append(args, "--nats-url", url, "--nats-creds", creds)...)
	}
	code, out, errs = as(acme, "submit", "--follow", "hello from acme")
	require.Equal(t, 0, code, out+errs)
	id := regexp.MustCompile(`\bq[A-Za-z0-9]{10,}\b`).FindString(out + errs)
	require.NotEmpty(t, id, out+errs)
	code, out, errs = as(acme, "tail", id)
	require.Equal(t, 0, code, out+errs)
	code, out, errs = as(acme, "status", id)
	require.Equal(t, 0, code, out+errs)
	// The status index catches up a moment after the run.
	fleettest.Eventually(t, time.Minute, func() bool {
		code, out, errs = as(acme, "ls", "-A")
		require.Equal(t, 0, code, out+errs)
		return strings.Contains(out, id)
	}, "acme's query listed")

	code, _, errs = as(other, "status", id)
	require.Equal(t, fleetcli.ExitNotFound, code, errs)
	code, _, errs = as(other, "tail", id, "--tenant", "acme")
	require.Equal(t, fleetcli.ExitUsage, code)
	require.Contains(t, errs, "tenant other's")
	code, out, _ = as(other, "ls", "-A")
	require.Equal(t, 0, code)
	require.NotContains(t, out, id)

	// Bad creds, each named.
	code, _, errs = as(filepath.Join(root, "missing.creds"), "status", id)
	require.Equal(t, fleetcli.ExitUsage, code)
	require.Contains(t, errs, "does not exist")
	bad := filepath.Join(root, "bad.creds")
	require.NoError(t, os.WriteFile(bad, []byte("garbage"), 0o600))
	code, _, errs = as(bad, "status", id)
	require.Equal(t, fleetcli.ExitUsage, code)
	require.Contains(t, errs, "malformed")

	// Revoked: refused by the server, said so; the other tenant goes on.
	code, out, errs = cli(t, "tenant", "revoke", "acme", "--dir", dir, "--nats-url", url)
	require.Equal(t, 0, code, out+errs)
	code, _, errs = as(acme, "status", id)
	require.Equal(t, fleetcli.ExitUnavailable, code)
	require.Contains(t, errs, "revoked")
	code, _, errs = as(other, "status", id)
	require.Equal(t, fleetcli.ExitNotFound, code, errs)
	code, _, errs = cli(t, "tenant", "revoke", "nobody", "--dir", dir, "--nats-url", url)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "no such tenant")
}

// A server whose resolver directory is not DIR/jwt (a container mounting
// it elsewhere) learns a new tenant's account from the push `tenant
// creds` makes.
func TestCLICredsPushNewAccount(t *testing.T) {
	root := t.TempDir()
	dir, elsewhere := filepath.Join(root, "auth"), filepath.Join(root, "server-jwt")
	code, _, errs := cli(t, "auth", "init", "--dir", dir, "--resolver-dir", elsewhere)
	require.Equal(t, 0, code, errs)
	s := serveDir(t, dir)
	creds := filepath.Join(root, "acme.creds")
	code, _, errs = cli(t, "tenant", "creds", "acme", "--dir", dir, "--out", creds, "--nats-url", s.Srv.ClientURL())
	require.Equal(t, 0, code, errs)
	require.NotContains(t, errs, "was not pushed")
	nc := s.connect(creds, nil)
	r, err := nc.Request("$SYS.REQ.USER.INFO", nil, 10*time.Second)
	require.NoError(t, err)
	require.Contains(t, string(r.Data), "tenant:acme")
	entries, err := os.ReadDir(elsewhere)
	require.NoError(t, err)
	require.NotEmpty(t, entries, "the server stored the pushed account")

	// Unreachable NATS: the creds are still made, and the note says why.
	code, _, errs = cli(t, "tenant", "creds", "late", "--dir", dir, "--nats-url", "nats://127.0.0.1:1")
	require.Equal(t, 0, code, errs)
	require.Contains(t, errs, "was not pushed")
}
