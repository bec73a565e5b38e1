//go:build !linux

package sandbox

import (
	"errors"
	"os/exec"
	"syscall"
)

// CheckContained reports that IsolationContained needs Linux.
func CheckContained() error {
	return errors.New("isolation contained: needs Linux namespaces (bubblewrap)")
}

type containedStart struct{}

func (l *Local) initContained() error { return CheckContained() }

func ownTree(*localSandbox) error { return nil }

func (s *localSandbox) prepareContained(ProcSpec, string, string, map[string]string) (*containedStart, error) {
	return nil, CheckContained()
}

func (ct *containedStart) cmd(*procPipes) *exec.Cmd        { return nil }
func (ct *containedStart) close()                          {}
func (ct *containedStart) stop()                           {}
func (ct *containedStart) handshake() error                { return CheckContained() }
func (ct *containedStart) signalAgent(syscall.Signal) bool { return false }

func applyLimits(containedRun, LocalConfig, Limits, bool) error { return nil }

func giveToAgent(*localSandbox, string) error { return nil }
