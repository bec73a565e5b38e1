package gctune

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestApply(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	env := map[string]string{}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }

	debug.SetGCPercent(100)
	require.Equal(t, Percent, apply(lookup), "nothing set: the fleet's default")
	require.Equal(t, Percent, debug.SetGCPercent(Percent))

	debug.SetGCPercent(50)
	env["GOGC"] = "50"
	require.Equal(t, 50, apply(lookup), "GOGC set: left alone")
	require.Equal(t, 50, debug.SetGCPercent(50))

	delete(env, "GOGC")
	env["GOMEMLIMIT"] = "64MiB"
	require.Equal(t, 50, apply(lookup), "GOMEMLIMIT set: left alone")
}
