package sandbox_test

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
)

type cfBundle struct {
	fake *bridgefake.Fake
	cf   *sandbox.Cloudflare
}

// setupCloudflare starts a fake bridge and a Cloudflare provider pointed at
// it. cfg's BaseURL, Token and Logger are filled in; short retry timings are
// used unless cfg sets them.
func setupCloudflare(t *testing.T, opts bridgefake.Options, cfg sandbox.CloudflareConfig) *cfBundle {
	t.Helper()
	fake := bridgefake.New(t, opts)
	cfg.BaseURL = fake.URL()
	if cfg.Token == "" {
		cfg.Token = fake.Token()
	}
	if cfg.Backoff == (sandbox.Backoff{}) {
		cfg.Backoff = sandbox.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}
	}
	logger := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	cfg.Logger = &logger
	cf, err := sandbox.NewCloudflare(cfg)
	require.NoError(t, err)
	t.Cleanup(cf.Close)
	return &cfBundle{fake: fake, cf: cf}
}

// TestCloudflareExercise runs the shared sandbox suite against the
// Cloudflare provider talking to the fake bridge, which runs processes on
// this machine.
func TestCloudflareExercise(t *testing.T) {
	sandboxtest.Exercise(t, func(t *testing.T) sandbox.Provider {
		return setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{}).cf
	}, sandboxtest.Features{
		SignalsReported: true,
		LocalPIDs:       true,
		SpawnErrors:     true,
		Interactive:     true,
	})
}
