package all_test

import (
	"context"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage/backends"
	_ "github.com/agentfleet/agentfleet/pkg/storage/backends/all"
	"github.com/agentfleet/agentfleet/pkg/storage/cfkv/kvfake"
)

func TestRegistersSDKBackends(t *testing.T) {
	t.Parallel()
	require.Contains(t, backends.Schemes(), "s3")
	require.Contains(t, backends.Schemes(), "cfkv")
}

func TestCFKVIsForStatusOnly(t *testing.T) {
	t.Parallel()
	_, err := backends.Open(context.Background(), "cfkv://acct/ns", backends.Objects, backends.Deps{})
	require.ErrorContains(t, err, "status records")
}

func TestCFKVOpensForStatus(t *testing.T) {
	// t.Setenv (the token comes from the environment): not parallel.
	srv := httptest.NewServer(kvfake.New("tok", "acct", "ns"))
	t.Cleanup(srv.Close)
	t.Setenv("CLOUDFLARE_API_TOKEN", "tok")
	st, err := backends.Open(context.Background(), "cfkv://acct/ns?endpoint="+url.QueryEscape(srv.URL+"/client/v4/"), backends.Status, backends.Deps{})
	require.NoError(t, err)
	defer st.Close()
	require.NoError(t, st.Put(context.Background(), "status/t/q.json", []byte(`{"v":1}`)))
	got, err := st.Get(context.Background(), "status/t/q.json")
	require.NoError(t, err)
	require.Equal(t, `{"v":1}`, string(got))
}
