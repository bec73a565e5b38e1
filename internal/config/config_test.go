package config_test

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/config"
)

func TestRedactURLs(t *testing.T) {
	t.Parallel()
	got := config.RedactURLs("nats://worker:s3cret@n1:4222, nats://n2:4222")
	require.NotContains(t, got, "s3cret")
	require.Contains(t, got, "nats://worker:xxxxx@n1:4222")
	require.Contains(t, got, "nats://n2:4222")
}

func TestFlagsWinOverEnvironment(t *testing.T) {
	// t.Setenv: not parallel.
	t.Setenv("FLEET_SLOTS", "7")
	t.Setenv("FLEET_PREFIX", "env-prefix")
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	var c config.Common
	config.AddCommon(fs, &c, "worker")
	slots := fs.Int("slots", 4, "")
	require.NoError(t, config.Parse(fs, []string{"--prefix", "flag-prefix"}))
	require.Equal(t, 7, *slots, "the environment fills a flag not given")
	require.Equal(t, "flag-prefix", c.Prefix, "a flag given wins over the environment")
	require.Equal(t, "_INBOX_worker", c.InboxPrefix)
	require.Equal(t, "FLEET_NATS_URL", config.EnvName("nats-url"))
}

func TestBadEnvironmentValueIsAnError(t *testing.T) {
	t.Setenv("FLEET_SLOTS", "many")
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Int("slots", 4, "")
	err := config.Parse(fs, nil)
	require.ErrorContains(t, err, "FLEET_SLOTS")
}
