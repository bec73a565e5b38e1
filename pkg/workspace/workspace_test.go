package workspace_test

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
	"github.com/agentfleet/agentfleet/pkg/workspace"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLocal runs the workspace suite with git in Local sandboxes.
func TestLocal(t *testing.T) {
	root := t.TempDir()
	workspacetest.Exercise(t, func(t *testing.T) sandbox.Provider {
		l, err := sandbox.NewLocal(sandbox.LocalConfig{Root: root})
		require.NoError(t, err)
		return l
	}, workspacetest.Features{Dir: func(id string) string { return filepath.Join(root, id) }})
}

// TestLocalCached runs the suite again with a repository cache shared by
// every checkout of the test (docs/warm.md): each must behave as without one,
// and the cache must serve them.
func TestLocalCached(t *testing.T) {
	root := t.TempDir()
	cache, err := repocache.Open(repocache.Config{Dir: filepath.Join(t.TempDir(), "cache"), AllowFile: true})
	require.NoError(t, err)
	var served atomic.Int64
	// After every (parallel) subtest of the suite:
	t.Cleanup(func() {
		mirrors, err := filepath.Glob(filepath.Join(cache.Dir(), "mirrors", "*.git"))
		require.NoError(t, err)
		require.NotEmpty(t, mirrors, "the cache served the suite's checkouts")
		require.Positive(t, served.Load())
	})
	workspacetest.Exercise(t, func(t *testing.T) sandbox.Provider {
		l, err := sandbox.NewLocal(sandbox.LocalConfig{Root: root})
		require.NoError(t, err)
		return l
	}, workspacetest.Features{
		Dir:    func(id string) string { return filepath.Join(root, id) },
		Cached: true,
		Config: func(t *testing.T, cfg *workspace.Config) {
			cfg.Cache = cache
			served.Add(1)
		},
	})
}

// TestCloudflare runs the same suite through the Cloudflare provider against
// the Go fake of the bridge: git runs over the bridge's generic exec route.
//
// Git credentials are the fake's (as they are the Worker's): its egress
// proxy adds them, and the worker hands the sandbox none.
func TestCloudflare(t *testing.T) {
	fake, cf := cloudflare(t, workspace.Credentials{})
	workspacetest.Exercise(t, func(t *testing.T) sandbox.Provider { return cf }, workspacetest.Features{
		Dir: fake.Workspace,
		WithGitCredentials: func(t *testing.T, creds workspace.Credentials) (sandbox.Provider, func(string) string) {
			fake, cf := cloudflare(t, creds)
			return cf, fake.Workspace
		},
	})
}

func cloudflare(t *testing.T, creds workspace.Credentials) (*bridgefake.Fake, *sandbox.Cloudflare) {
	fake := bridgefake.New(t, bridgefake.Options{GitCredentials: creds})
	logger := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{
		BaseURL: fake.URL(), Token: fake.Token(), Logger: &logger,
		Backoff: sandbox.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
	})
	require.NoError(t, err)
	t.Cleanup(cf.Close)
	return fake, cf
}
