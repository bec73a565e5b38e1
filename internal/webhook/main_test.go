package webhook_test

import (
	"testing"

	"github.com/agentfleet/agentfleet/internal/fleettest"
)

func TestMain(m *testing.M) { fleettest.MainNoLeaks(m) }
