package gateway_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any of them leaks a goroutine.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
