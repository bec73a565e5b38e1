package main

import (
	"errors"
	"fmt"
	"os/exec"
	"time"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// checkFlags refuses, before anything connects, settings that would fail
// later with an internal message or quietly mean something else.
func checkFlags(slots int, sbName, cfURL string, command []string) error {
	if slots < 1 || slots > 1024 {
		return fmt.Errorf("--slots must be between 1 and 1024, not %d", slots)
	}
	switch sbName {
	case protocol.SandboxLocal:
		// The agent runs on this machine: it must be there.
		if _, err := exec.LookPath(command[0]); err != nil {
			return fmt.Errorf("--agent-cmd: %q is not an executable on PATH (install Claude Code with 'npm install -g @anthropic-ai/claude-code', or point --agent-cmd at the agent program): %w", command[0], err)
		}
	case protocol.SandboxCloudflare:
		if cfURL == "" {
			return errors.New("--sandbox cloudflare needs --cf-bridge-url (env FLEET_CF_BRIDGE_URL): the URL of the bridge Worker deployed from deploy/cloudflare")
		}
	default:
		return fmt.Errorf("--sandbox must be %s or %s, not %q", protocol.SandboxLocal, protocol.SandboxCloudflare, sbName)
	}
	return nil
}

// stopMargin is what the worker needs on top of --shutdown-grace to hand
// jobs back, flush its journal and exit: run's stop context allows it.
const stopMargin = time.Minute
