package sandbox

import (
	"encoding/binary"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// BPF and seccomp constants (linux/filter.h, linux/seccomp.h).
const (
	bpfLdAbsW   = 0x20 // BPF_LD | BPF_W | BPF_ABS
	bpfJeqK     = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	bpfJsetK    = 0x45 // BPF_JMP | BPF_JSET | BPF_K
	bpfRetK     = 0x06 // BPF_RET | BPF_K
	retAllow    = 0x7fff0000
	retErrno    = 0x00050000
	x32Bit      = 0x40000000 // __X32_SYSCALL_BIT
	offNr       = 0
	offArch     = 4
	offArg0     = 16
	cloneNewUsr = unix.CLONE_NEWUSER
)

// userNSFilter is the seccomp program (bwrap --seccomp) that keeps a
// contained agent from making user namespaces of its own, which a root
// worker cannot forbid with --disable-userns (bwrap refuses it beside
// --userns-block-fd): unshare fails with EPERM, clone with CLONE_NEWUSER
// too, clone3 with ENOSYS (glibc then uses clone), and so do the x32 and
// foreign-architecture entry points. nil where the architecture is not
// known here.
func userNSFilter() []byte {
	var arch uint32
	switch runtime.GOARCH {
	case "amd64":
		arch = unix.AUDIT_ARCH_X86_64
	case "arm64":
		arch = unix.AUDIT_ARCH_AARCH64
	default:
		return nil
	}
	type ins struct {
		code   uint16
		jt, jf uint8
		k      uint32
	}
	prog := []ins{
		{bpfLdAbsW, 0, 0, offArch},                      // 0
		{bpfJeqK, 1, 0, arch},                           // 1: our arch → 3
		{bpfRetK, 0, 0, retErrno | uint32(unix.ENOSYS)}, // 2
		{bpfLdAbsW, 0, 0, offNr},                        // 3
		{bpfJsetK, 7, 0, x32Bit},                        // 4: x32 → 12
		{bpfJeqK, 6, 0, unix.SYS_UNSHARE},               // 5: → 12
		{bpfJeqK, 6, 0, unix.SYS_CLONE3},                // 6: → 13
		{bpfJeqK, 1, 0, unix.SYS_CLONE},                 // 7: → 9
		{bpfRetK, 0, 0, retAllow},                       // 8
		{bpfLdAbsW, 0, 0, offArg0},                      // 9: clone's flags (low word)
		{bpfJsetK, 1, 0, cloneNewUsr},                   // 10: → 12
		{bpfRetK, 0, 0, retAllow},                       // 11
		{bpfRetK, 0, 0, retErrno | uint32(unix.EPERM)},  // 12
		{bpfRetK, 0, 0, retErrno | uint32(unix.ENOSYS)}, // 13
	}
	b := make([]byte, 0, 8*len(prog))
	for _, in := range prog {
		b = binary.NativeEndian.AppendUint16(b, in.code)
		b = append(b, in.jt, in.jf)
		b = binary.NativeEndian.AppendUint32(b, in.k)
	}
	return b
}

// seccompFile is a memfd holding userNSFilter, or nil.
func seccompFile() (*os.File, error) {
	prog := userNSFilter()
	if prog == nil {
		return nil, nil
	}
	return memfdWith(string(prog))
}
