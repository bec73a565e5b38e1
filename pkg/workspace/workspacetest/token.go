package workspacetest

import (
	"bytes"
	"context"
	"encoding/base64"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// testJobToken: a job's own token (workspace.token, minted by the fleet)
// is the password of x-access-token for the fetch and the push, and
// reaches neither the agent nor the stored work; the worker has no
// credentials of its own.
func (s *suite) testJobToken(t *testing.T) {
	if s.f.WithGitCredentials != nil {
		t.Skip("a provider that brokers credentials takes no job token")
	}
	const user, token = "x-access-token", "ghs_J0bT0ken7c6b5a"
	tmp := t.TempDir()
	repo := NewRepo(t, tmp)
	srv := Serve(t, tmp, user, token)
	url := srv.URL + "/origin.git"
	store, err := storage.NewFS(filepath.Join(tmp, "store"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ws, err := s.newWorkspaces(t, workspace.Config{Store: store})
	require.NoError(t, err)

	// A wrong token is refused: a checkout error, not a retry.
	_, err = ws.Checkout(ctx, s.sandbox(t, ctx), spec(url, protocol.Workspace{Token: "ghs_wrong"}))
	require.ErrorIs(t, err, workspace.ErrCheckout)

	sb := s.sandbox(t, ctx)
	base, err := ws.Checkout(ctx, sb, spec(url, protocol.Workspace{Push: true, Token: token}))
	require.NoError(t, err)
	require.Equal(t, repo.Main, base.StartSHA)
	secrets := []string{token, base64.StdEncoding.EncodeToString([]byte(user + ":" + token))}
	seen := Run(t, ctx, sb, "sh", "-c", "env; cat /proc/self/cmdline; cat .git/config; git config --list --show-origin; git remote -v")
	for _, sec := range secrets {
		require.NotContains(t, seen, sec)
	}
	DoAgentWork(t, ctx, sb)
	art, err := ws.Capture(ctx, sb, base)
	require.NoError(t, err)
	require.True(t, art.Pushed, art.PushError)
	require.Equal(t, art.EndSHA, Git(t, repo.Bare, "rev-parse", "refs/heads/fleet/acme/q1"))
	scanTree(t, s.f.Dir(sb.ID()), secrets)
	for _, key := range []string{art.DiffKey, art.BundleKey} {
		data, err := store.Get(ctx, key)
		require.NoError(t, err)
		for _, sec := range secrets {
			require.False(t, bytes.Contains(data, []byte(sec)), "%s holds the secret", key)
		}
	}
}
