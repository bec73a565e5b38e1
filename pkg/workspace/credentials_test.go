package workspace_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/workspace"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// A remote that refuses the credentials is named, and the reason says the
// credentials were refused (git alone says "could not read Username"). The
// credentials file is read again when it changes: rotating it needs no
// restart.
func TestRefusedCredentialsAreNamedAndARotatedFileIsReadAgain(t *testing.T) {
	const user, token = "fleet-bot", "r0tated-T0KEN-1a2b3c"
	tmp := t.TempDir()
	workspacetest.NewRepo(t, tmp) // origin.git, served below
	srv := workspacetest.Serve(t, tmp, user, token)
	url := srv.URL + "/origin.git"
	store, err := storage.NewFS(filepath.Join(tmp, "store"))
	require.NoError(t, err)
	local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: filepath.Join(tmp, "sandboxes")})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := 0
	checkout := func(ws *workspace.Workspaces) error {
		n++
		sb, err := local.Create(ctx, sandbox.Spec{ID: "cred-" + strings.Repeat("x", n)})
		require.NoError(t, err)
		defer func() { _ = sb.Destroy(context.Background()) }()
		_, err = ws.Checkout(ctx, sb, workspace.Spec{Tenant: "acme", ID: "q1", Workspace: protocol.Workspace{Repo: url}})
		return err
	}
	credLine := func(tok string) []byte {
		return []byte(strings.Replace(srv.URL, "://", "://"+user+":"+tok+"@", 1) + "\n")
	}

	// No credentials for the host: the message says so and names the flag.
	anon, err := workspace.New(workspace.Config{Store: store})
	require.NoError(t, err)
	err = checkout(anon)
	require.ErrorIs(t, err, workspace.ErrCheckout)
	require.ErrorContains(t, err, "asks for credentials and the worker has none for it (--git-credentials)")
	require.ErrorContains(t, err, srv.URL)

	// Wrong credentials: refused, named, never shown.
	file := filepath.Join(tmp, "git-credentials")
	require.NoError(t, os.WriteFile(file, credLine("stale-token"), 0o600))
	creds, err := workspace.LoadCredentials(file)
	require.NoError(t, err)
	ws, err := workspace.New(workspace.Config{Store: store, Credentials: creds})
	require.NoError(t, err)
	err = checkout(ws)
	require.ErrorIs(t, err, workspace.ErrCheckout)
	require.ErrorContains(t, err, "the remote "+srv.URL+" refused the worker's git credentials for it")
	require.NotContains(t, err.Error(), "stale-token")

	// The operator rotates the file; the same Workspaces uses the new one.
	require.NoError(t, os.WriteFile(file+".new", credLine(token), 0o600))
	require.NoError(t, os.Rename(file+".new", file))
	require.NoError(t, checkout(ws))

	// A file broken by a bad edit keeps the last good credentials, and the
	// refusal of a remote then says the file could not be read.
	require.NoError(t, os.WriteFile(file, []byte("not a url\n"), 0o600))
	require.NoError(t, checkout(ws), "the last good credentials still work")
	require.Equal(t, 1, creds.Len())
}
