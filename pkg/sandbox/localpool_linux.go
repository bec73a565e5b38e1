package sandbox

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/pkg/rawio"
)

// privateDirNames reports whether path is a directory (not a symlink) of
// mode 0700, and its entries' names. It opens the directory once, with
// O_NOFOLLOW, and checks and reads that descriptor: every Destroy of a
// pristine sandbox checks five directories, where os.Lstat, os.Open and
// Readdirnames cost seven system calls each.
func privateDirNames(path string) (names []string, ok bool) {
	fd, err := rawio.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Mode&0o777 != 0o700 {
		return nil, false
	}
	var buf [1024]byte
	for {
		n, err := unix.Getdents(fd, buf[:])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return nil, false
		case n == 0:
			return names, true
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}
