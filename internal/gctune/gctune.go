package gctune

import (
	"os"
	"runtime/debug"
)

// Percent is the GC target Apply sets (GOGC=400).
const Percent = 400

// Apply sets the GC target to Percent unless GOGC or GOMEMLIMIT is set in
// the environment. It returns the target in force.
func Apply() int {
	return apply(os.LookupEnv)
}

func apply(lookup func(string) (string, bool)) int {
	_, gogc := lookup("GOGC")
	_, limit := lookup("GOMEMLIMIT")
	if gogc || limit {
		old := debug.SetGCPercent(100)
		debug.SetGCPercent(old)
		return old
	}
	debug.SetGCPercent(Percent)
	return Percent
}
