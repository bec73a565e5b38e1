// Command worker pulls query jobs and runs each in a sandbox, relaying every
// line the agent writes. Run it as plain `worker` with flags (or FLEET_*
// environment variables; flags win).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/agentfleet/agentfleet/internal/gctune"
	"github.com/agentfleet/agentfleet/internal/procscrub"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// secretFlags take a secret as their value.
var secretFlags = []string{"--cf-bridge-token"}

// maskArgs masks what /proc/<pid>/cmdline must not show: passwords in URLs
// (--nats-url) and the values of secretFlags.
func maskArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = procscrub.MaskURLPassword(a)
		for _, f := range secretFlags {
			switch {
			case strings.HasPrefix(a, f+"="):
				out[i] = f + "=" + strings.Repeat(string(procscrub.Mask), len(a)-len(f)-1)
			case i > 0 && args[i-1] == f:
				out[i] = strings.Repeat(string(procscrub.Mask), len(a))
			}
		}
	}
	return out
}

// scrubbedEnv names the variables /proc/<pid>/environ must not show: the
// sandbox's deny-list and the model credential (the gateway's).
func scrubbedEnv(name string) bool { return sandbox.DeniedEnv(name) || gateway.IsCredentialEnv(name) }

func main() {
	// First, before anything reads os.Args: the agents this worker starts
	// run as its user, and must not read its secrets in /proc.
	if err := procscrub.Scrub(scrubbedEnv, maskArgs); err != nil {
		fmt.Fprintf(os.Stderr, "worker: hiding secrets from other processes: %v\n", err)
	}
	gctune.Apply()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	code := run(ctx, stop, os.Args[1:])
	if code != 0 {
		fmt.Fprintf(os.Stderr, "worker: exit %d\n", code)
	}
	os.Exit(code)
}
