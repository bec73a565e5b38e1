// Command dispatcher is the fleet's control service (`dispatcher serve`)
// and its command line for people (submit, tail, status, cancel, ls,
// version); `dispatcher --help` lists them.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/gctune"
)

func main() {
	stdio := fleetcli.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		gctune.Apply()
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		os.Exit(serve(ctx, stop, os.Args[2:], stdio))
	}
	ctx, stop := fleetcli.SignalContext(context.Background())
	code := fleetcli.Run(ctx, os.Args[1:], stdio)
	stop()
	os.Exit(code)
}
