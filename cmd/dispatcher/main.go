// Command dispatcher is the fleet's control service (`dispatcher serve`)
// and its command line for people (submit, tail, status, cancel, ls).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		fmt.Fprintf(os.Stderr, "usage: dispatcher serve [flags]\n\n%s", fleetcli.Usage)
		os.Exit(fleetcli.ExitUsage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	stdio := fleetcli.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}
	if os.Args[1] == "serve" {
		os.Exit(serve(ctx, stop, os.Args[2:], stdio))
	}
	os.Exit(fleetcli.Run(ctx, os.Args[1], os.Args[2:], stdio))
}
