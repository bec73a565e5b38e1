package workspace_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/workspace"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// cachedFixture is a repository, a local provider and Workspaces with a
// repository cache.
type cachedFixture struct {
	repo  *workspacetest.Repo
	local *sandbox.Local
	ws    *workspace.Workspaces
	cache *repocache.Cache
	n     int
}

func newCachedFixture(t *testing.T) *cachedFixture {
	tmp := t.TempDir()
	f := &cachedFixture{repo: workspacetest.NewRepo(t, tmp)}
	var err error
	f.cache, err = repocache.Open(repocache.Config{Dir: filepath.Join(tmp, "cache"), AllowFile: true})
	require.NoError(t, err)
	f.local, err = sandbox.NewLocal(sandbox.LocalConfig{Root: filepath.Join(tmp, "sandboxes")})
	require.NoError(t, err)
	store, err := storage.NewFS(filepath.Join(tmp, "store"))
	require.NoError(t, err)
	f.ws, err = workspace.New(workspace.Config{Store: store, AllowFile: true, Cache: f.cache})
	require.NoError(t, err)
	return f
}

func (f *cachedFixture) checkout(t *testing.T) (workspace.Base, sandbox.Sandbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f.n++
	sb, err := f.local.Create(ctx, sandbox.Spec{ID: "cached-" + strconv.Itoa(f.n)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	base, err := f.ws.Checkout(ctx, sb, workspace.Spec{Tenant: "acme", ID: "q" + strconv.Itoa(f.n), Workspace: protocol.Workspace{Repo: f.repo.URL}})
	require.NoError(t, err)
	return base, sb
}

func TestACachedCheckoutSaysHowTheCacheServedIt(t *testing.T) {
	t.Parallel()
	f := newCachedFixture(t)
	first, _ := f.checkout(t)
	require.Equal(t, workspace.CacheMiss, first.Cache)
	require.Equal(t, f.repo.Main, first.StartSHA)
	second, sb := f.checkout(t)
	require.Equal(t, workspace.CacheHit, second.Cache)
	require.Equal(t, f.repo.Main, second.StartSHA)
	out := workspacetest.Run(t, context.Background(), sb, "git", "status", "--porcelain")
	require.Empty(t, out, "a clean checkout of the work branch")
}

// A cache that cannot do its work (here its directory is gone and a file
// stands in its way, as a full disk would stop it) leaves the checkout to
// the remote: the job runs cold and says so; nothing fails for it.
func TestABrokenCacheLeavesTheCheckoutCold(t *testing.T) {
	t.Parallel()
	f := newCachedFixture(t)
	mirrors := filepath.Join(f.cache.Dir(), "mirrors")
	require.NoError(t, os.RemoveAll(mirrors))
	require.NoError(t, os.WriteFile(mirrors, []byte("in the way"), 0o600))
	base, _ := f.checkout(t)
	require.Equal(t, workspace.CacheCold, base.Cache)
	require.NotEmpty(t, base.CacheCold)
	require.Equal(t, f.repo.Main, base.StartSHA)
}
