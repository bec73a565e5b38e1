package sandbox_test

import (
	"testing"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
)

// requireContained fails (or, where namespaces cannot exist, skips with the
// reason) unless this machine can run contained sandboxes.
func requireContained(t *testing.T) {
	t.Helper()
	if err := sandbox.CheckContained(); err != nil {
		t.Skipf("contained sandboxes cannot run here: %v", err)
	}
}

// TestContainedExercise runs the shared sandbox suite against contained
// sandboxes. Their processes live in a PID namespace of their own, so the
// suite cannot check pids from outside (LocalPIDs), and bwrap reports a
// signal's death as an exit code (SignalsReported).
func TestContainedExercise(t *testing.T) {
	requireContained(t)
	sandboxtest.Exercise(t, func(t *testing.T) sandbox.Provider {
		return setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained}).local
	}, sandboxtest.Features{SpawnErrors: true, Interactive: true})
}
