package pprofserve

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

func TestOffByDefault(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	var addr string
	AddFlag(fs, &addr)
	require.NoError(t, fs.Parse(nil))
	require.Empty(t, addr)
	s, err := Start(addr, zerolog.Nop())
	require.NoError(t, err)
	require.Nil(t, s)
	require.NoError(t, s.Stop(context.Background()))
}

func TestServesProfiles(t *testing.T) {
	s, err := Start("127.0.0.1:0", zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	resp, err := http.Get("http://" + s.Addr() + "/debug/pprof/goroutine?debug=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.True(t, strings.Contains(string(b), "goroutine profile"), "got %.200s", b)
}
