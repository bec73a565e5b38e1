package worker_test

import (
	"testing"

	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// Every run's goroutines (heartbeat, relay, sandbox cleanup) must be gone
// once the worker stopped: goleak checks after the tests.
func TestMain(m *testing.M) { fleettest.MainNoLeaks(m) }
