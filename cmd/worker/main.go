// Command worker pulls query jobs and runs each in a sandbox, relaying every
// line the agent writes. Run it as plain `worker` with flags (or FLEET_*
// environment variables; flags win).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentfleet/agentfleet/internal/gctune"
)

func main() {
	gctune.Apply()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	code := run(ctx, stop, os.Args[1:])
	if code != 0 {
		fmt.Fprintf(os.Stderr, "worker: exit %d\n", code)
	}
	os.Exit(code)
}
