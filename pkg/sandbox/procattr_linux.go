package sandbox

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr puts the child in its own process group and asks the kernel to
// SIGKILL it if the worker dies. Pdeathsig fires when the OS thread that
// started the child exits; the Go runtime keeps its threads alive, so in
// practice that is when the worker process dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitExitedNoReap blocks until process pid has exited without reaping it, so
// its PID (and thus its process group ID) cannot be reused until the caller
// reaps it. That makes signalling the group after the leader's exit safe.
func waitExitedNoReap(pid int) error {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// pendingBytes returns how many bytes wait unread in the pipe f, or 0.
func pendingBytes(f *os.File) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
	return n
}
