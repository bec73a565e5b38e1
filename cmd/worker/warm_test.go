package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/workspace"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// warmSandboxes lists the warm agents' sandbox directories under dir.
func warmSandboxes(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "warm-*"))
	require.NoError(t, err)
	return m
}

// --warm keeps an agent started ahead in a sandbox of its own, stopped
// and removed at shutdown; --repo-cache serves a repository's second
// checkout from the tree it prepared after the first (running says
// workspace.cache "tree") and keeps setup environments in DIR/envs.
func TestWarmAndRepoCacheFlags(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	dir := t.TempDir()
	sbDir, cacheDir := filepath.Join(dir, "sb"), filepath.Join(dir, "cache")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, func() {}, []string{
			"--nats-url", f.Srv.ClientURL(), "--storage", "file://" + filepath.Join(dir, "data"),
			"--journal-dir", filepath.Join(dir, "journal"), "--sandbox-dir", sbDir,
			"--agent-cmd", strings.Join(fleettest.AgentCommand(t), " "), "--slots", "1", "--log-level", "error",
			"--inbox-prefix", "_INBOX", "--warm", "1", "--repo-cache", cacheDir, "--workspace-allow-file",
		})
	}()
	fleettest.Eventually(t, 2*time.Minute, func() bool { return len(warmSandboxes(t, sbDir)) > 0 }, "a warm agent's sandbox")

	repo := workspacetest.NewRepo(t, t.TempDir())
	var caches []string
	for _, id := range []string{"rc-1", "rc-2"} {
		b, err := json.Marshal(protocol.Job{ID: id, Prompt: "/standin cat=README.md", Workspace: &protocol.Workspace{Repo: repo.URL}})
		require.NoError(t, err)
		f.PublishJob("default", b, map[string]string{protocol.HeaderMsgID: id})
		r := f.Follow("default", id, 3*time.Minute)
		require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
		i := slices.IndexFunc(r.Statuses, func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRunning })
		require.GreaterOrEqual(t, i, 0)
		running := r.Statuses[i]
		require.NotNil(t, running.Warm)
		require.False(t, *running.Warm, "a workspace job starts cold")
		caches = append(caches, running.Workspace.Cache)
		if id == "rc-1" {
			// --repo-cache-trees 1 (the default): the next job's tree is
			// prepared in the background.
			fleettest.Eventually(t, 2*time.Minute, func() bool {
				trees, _ := filepath.Glob(filepath.Join(cacheDir, "trees", "*", "*.tree"))
				return len(trees) == 1
			}, "a prepared tree")
		}
	}
	require.Equal(t, []string{workspace.CacheMiss, workspace.CacheTree}, caches)
	_, err := os.Stat(filepath.Join(cacheDir, "envs"))
	require.NoError(t, err, "the setup environments' directory")

	cancel()
	select {
	case code := <-exit:
		require.Equal(t, 0, code)
	case <-time.After(2 * time.Minute):
		t.Fatal("the worker did not exit")
	}
	require.Empty(t, warmSandboxes(t, sbDir), "the warm agents' sandboxes are removed at shutdown")
}
