package sandbox_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
)

// TestMain turns the test binary into a sandboxtest child when asked to, so
// the tests run it as their sandboxed program, and checks for leaked
// goroutines after a run.
func TestMain(m *testing.M) {
	if !sandboxtest.RunChild() {
		goleak.VerifyTestMain(m)
	}
}
