package sandbox_test

import (
	"encoding/json"
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
)

// A bridge of the previous release (no GET /v1/version, no /model routes)
// is refused before any sandbox is created, with one error naming both
// versions that retrying will not change; the bridge is asked once
// however many creates follow.
func TestCloudflareRefusesABridgeWithoutWhatTheWorkerNeeds(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{Legacy: true}, sandbox.CloudflareConfig{WorkerVersion: "v9.9.9"})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { _, errs[i] = b.cf.Create(testCtx(t), sandbox.Spec{ID: "old-bridge"}) })
	}
	wg.Wait()
	for _, err := range errs {
		bi, ok := sandbox.IsBridgeIncompatible(err)
		require.True(t, ok, "%v", err)
		require.Equal(t, "unknown (before "+sandbox.BridgeVersion+")", bi.Bridge)
		require.Equal(t, "v9.9.9", bi.Worker)
		require.ElementsMatch(t, sandbox.BridgeNeeds, bi.Missing)
		require.ErrorContains(t, err, "unknown (before "+sandbox.BridgeVersion+")")
		require.ErrorContains(t, err, "v9.9.9")
		require.False(t, sandbox.Retryable(err))
		require.True(t, errors.Is(err, sandbox.ErrInvalid))
	}
	require.Zero(t, b.fake.Creates(), "nothing created on a bridge the worker cannot use")
	require.Equal(t, 1, b.fake.VersionAsks(), "the bridge is asked once")
}

// The bridge of this release answers what it supports, and a worker uses
// it, asking once.
func TestCloudflareLearnsTheBridgeOnce(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	info, err := b.cf.Bridge(testCtx(t))
	require.NoError(t, err)
	require.Equal(t, sandbox.BridgeVersion, info.Version)
	require.Empty(t, info.Missing(sandbox.BridgeNeeds))
	for _, id := range []string{"new-1", "new-2"} {
		sb, err := b.cf.Create(testCtx(t), sandbox.Spec{ID: id})
		require.NoError(t, err)
		require.NoError(t, sb.Destroy(testCtx(t)))
	}
	require.Equal(t, 1, b.fake.VersionAsks())
}

func FuzzDecodeBridgeInfo(f *testing.F) {
	f.Add([]byte(`{"version":"0.2.0","capabilities":["model","stdin"]}`))
	f.Add([]byte(`{"version":"","capabilities":[]}`))
	f.Add([]byte(`{"version":"1.0.0","capabilities":["a b"],"extra":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := sandbox.DecodeBridgeInfo(b)
		if err != nil {
			require.ErrorIs(t, err, sandbox.ErrInvalid)
			return
		}
		require.NotEmpty(t, info.Version)
		require.LessOrEqual(t, len(info.Capabilities), 64)
		require.NotEmpty(t, info.VersionText())
	})
}

// The bridge of this release says the version the worker knows it by: the
// TypeScript constant, package.json and sandbox.BridgeVersion agree.
func TestBridgeVersionMatchesTheBridgeSource(t *testing.T) {
	t.Parallel()
	pkg, err := os.ReadFile("../../deploy/cloudflare/package.json")
	require.NoError(t, err)
	var p struct{ Version string }
	require.NoError(t, json.Unmarshal(pkg, &p))
	require.Equal(t, sandbox.BridgeVersion, p.Version, "deploy/cloudflare/package.json")
	ts, err := os.ReadFile("../../deploy/cloudflare/src/version.ts")
	require.NoError(t, err)
	require.Contains(t, string(ts), "export const BRIDGE_VERSION = '"+sandbox.BridgeVersion+"';")
	for _, c := range sandbox.BridgeNeeds {
		require.Contains(t, string(ts), "'"+c+"'", "the bridge lists %s", c)
	}
}
