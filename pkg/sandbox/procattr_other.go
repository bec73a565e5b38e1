//go:build unix && !linux

package sandbox

import (
	"errors"
	"os"
	"syscall"
)

// sysProcAttr puts the child in its own process group. (Pdeathsig exists
// only on Linux.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// waitExitedNoReap is not available here: the group is then signalled
// right after the leader is reaped.
func waitExitedNoReap(int) error { return errors.ErrUnsupported }

// pendingBytes is not implemented here; with the default WaitDelay it is
// not needed.
func pendingBytes(*os.File) int { return 0 }
