package webhook_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/webhook"
)

func TestCheckURL(t *testing.T) {
	lookup := func(_ context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "inside.example":
			return []netip.Addr{netip.MustParseAddr("10.1.2.3")}, nil
		case "outside.example":
			return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil
		}
		return nil, errors.New("no such host")
	}
	ctx := context.Background()
	for _, u := range []string{"http://127.0.0.1:9/x", "http://localhost.:9", "https://10.0.0.1/", "http://192.168.1.1",
		"http://169.254.169.254/latest/meta-data", "http://[::1]:80/", "http://[fe80::1]/", "http://0.0.0.0/", "https://inside.example/hook",
		"http://100.64.0.1/", "http://[::ffff:127.0.0.1]/"} {
		err := webhook.CheckURL(ctx, u, false, func(ctx context.Context, host string) ([]netip.Addr, error) {
			if host == "localhost." {
				return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
			}
			return lookup(ctx, host)
		})
		require.ErrorIs(t, err, webhook.ErrPrivate, u)
		require.NoError(t, webhook.CheckURL(ctx, u, true, lookup), "allowed with --webhook-allow-private: %s", u)
	}
	for _, u := range []string{"ftp://outside.example/", "outside.example/hook", "http://", "https://user:pw@outside.example/", "http://nowhere.example/"} {
		err := webhook.CheckURL(ctx, u, false, lookup)
		require.Error(t, err, u)
		require.NotErrorIs(t, err, webhook.ErrPrivate, u)
	}
	require.NoError(t, webhook.CheckURL(ctx, "https://outside.example/hook?x=1", false, lookup))
	require.NoError(t, webhook.CheckURL(ctx, "http://93.184.216.34:8080/", false, lookup))
}

func TestParseEvents(t *testing.T) {
	all, err := webhook.ParseEvents("")
	require.NoError(t, err)
	require.Equal(t, webhook.Events, all)
	got, err := webhook.ParseEvents("failed, succeeded,failed")
	require.NoError(t, err)
	require.Equal(t, []string{"failed", "succeeded"}, got)
	_, err = webhook.ParseEvents("running")
	require.ErrorContains(t, err, "not one of")
}
