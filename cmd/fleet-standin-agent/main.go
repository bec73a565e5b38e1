// Command fleet-standin-agent is the bundled STAND-IN for `claude`: it speaks
// stream-json without calling any model, so the fleet runs end to end
// offline. See package internal/standin for what it writes.
package main

import (
	"os"

	"github.com/agentfleet/agentfleet/internal/standin"
)

func main() {
	os.Exit(standin.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
