package relay

import (
	"testing"

	"go.uber.org/goleak"
)

// Every relay's publisher goroutine must be gone once its test ended.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
