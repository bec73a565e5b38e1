//go:build !linux

package sandbox

import (
	"fmt"
	"time"
)

var _ CPUMeter = (*localSandbox)(nil)

// CPUTime is not measured outside Linux.
func (s *localSandbox) CPUTime() (time.Duration, error) {
	return 0, fmt.Errorf("sandbox: CPU time is measured on Linux only: %w", ErrUnavailable)
}
