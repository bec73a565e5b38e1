//go:build !linux

package sandbox

import "fmt"

// newContainment returns the containment for mode. Only the process group is
// available outside Linux.
func newContainment(mode string) (containment, string, error) {
	switch mode {
	case ContainAuto:
		return groupOnly{}, "no cgroups or /proc on this system", nil
	case ContainGroup:
		return groupOnly{}, "", nil
	}
	return nil, "", fmt.Errorf("sandbox: containment %q needs Linux: %w", mode, ErrInvalid)
}
