package admission

import (
	"testing"

	"go.uber.org/goleak"
)

// The admitter starts goroutines (watchers, the campaign, the pauser);
// none may outlive its Stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
