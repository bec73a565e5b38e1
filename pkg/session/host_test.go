package session_test

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// counting counts the processes started in a sandbox; it hides the
// sandbox's HostConfigDir (so session uses helper processes).
type counting struct {
	sandbox.Sandbox
	starts atomic.Int64
}

func (c *counting) Start(ctx context.Context, spec sandbox.ProcSpec) (sandbox.Process, error) {
	c.starts.Add(1)
	return c.Sandbox.Start(ctx, spec)
}

// countingHost is counting with the sandbox's HostConfigDir.
type countingHost struct {
	*counting
	dir string
}

func (c countingHost) HostConfigDir() string { return c.dir }

func localSandbox(t *testing.T, id string) (sandbox.Sandbox, string) {
	t.Helper()
	root := t.TempDir()
	l, err := sandbox.NewLocal(sandbox.LocalConfig{Root: root})
	require.NoError(t, err)
	sb, err := l.Create(t.Context(), sandbox.Spec{ID: id})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return sb, filepath.Join(root, id, "home", ".claude")
}

const sid = "0b7e4d2c-1111-4222-8333-944455556666"

// TestSessionFileOnTheHostLooksWithoutProcesses: on a local sandbox the
// transcript is looked up in the config dir directly: no session file
// costs no process at all (through helpers: printenv and find), and one
// found is read with one (cat), the same bytes as through helpers.
func TestSessionFileOnTheHostLooksWithoutProcesses(t *testing.T) {
	sb, dir := localSandbox(t, "host1")
	host := countingHost{counting: &counting{Sandbox: sb}, dir: sb.(sandbox.HostConfigDir).HostConfigDir()}
	_, err := session.SessionFile(t.Context(), host, sid)
	require.ErrorIs(t, err, session.ErrNoSessionFile)
	require.Zero(t, host.starts.Load(), "no helper process to find nothing")
	helpers := &counting{Sandbox: sb}
	_, err = session.SessionFile(t.Context(), helpers, sid)
	require.ErrorIs(t, err, session.ErrNoSessionFile)
	require.Equal(t, int64(2), helpers.starts.Load(), "printenv, find")

	require.NoError(t, os.MkdirAll(filepath.Join(dir, "projects", "-work"), 0o700))
	want := []byte(`{"type":"user","message":"remember 42"}` + "\n")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "projects", "-work", sid+".jsonl"), want, 0o600))
	got, err := session.SessionFile(t.Context(), host, sid)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, int64(1), host.starts.Load(), "cat only")
	viaHelpers, err := session.SessionFile(t.Context(), helpers, sid)
	require.NoError(t, err)
	require.Equal(t, want, viaHelpers)
}

// TestSessionFileOnTheHostFollowsNoSymlinkOut: a transcript that is a
// symlink, or under a project directory that is one, pointing out of the
// config dir (an agent planting a worker file) is not read.
func TestSessionFileOnTheHostFollowsNoSymlinkOut(t *testing.T) {
	sb, dir := localSandbox(t, "host3")
	outside := t.TempDir()
	secret := filepath.Join(outside, sid+".jsonl")
	require.NoError(t, os.WriteFile(secret, []byte("worker secret"), 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "projects", "p"), 0o700))
	require.NoError(t, os.Symlink(secret, filepath.Join(dir, "projects", "p", sid+".jsonl")))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "projects", "q")))
	_, err := session.SessionFile(t.Context(), sb, sid)
	require.ErrorIs(t, err, session.ErrNoSessionFile)
}
