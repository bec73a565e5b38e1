package storage

import (
	"errors"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/pkg/rawio"
)

// haveSyncfs: syncfs(2) flushes every dirty page and inode of the
// filesystem holding the root in one call.
const haveSyncfs = true

// The functions below use the system calls directly: an *os.File opened on
// a regular file or a directory costs four fcntl calls and a failed
// epoll_ctl beside its open and close (the poller refuses such files), which
// on the dispatcher's write path were more calls than the writes
// themselves.

func (s *FS) syncAll() error { return onDir(s.root, "syncfs", unix.Syncfs) }

// stage writes value to a new temporary file "~tmp-*" in dir and returns
// its path. It does not fsync: PutBatch syncs the whole filesystem after
// staging a batch. A missing dir fails with an error matching
// fs.ErrNotExist, a file in its path with syscall.ENOTDIR.
func stage(dir string, value []byte) (string, error) {
	for try := 0; ; try++ {
		name := filepath.Join(dir, "~tmp-"+strconv.FormatUint(rand.Uint64(), 36))
		fd, err := rawio.Open(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) && try < 100 {
			continue
		}
		if err != nil {
			return "", &fs.PathError{Op: "open", Path: name, Err: err}
		}
		err = rawio.WriteAll(fd, value)
		if cerr := unix.Close(fd); err == nil {
			err = cerr
		}
		if err != nil {
			_ = unix.Unlink(name)
			return "", &fs.PathError{Op: "write", Path: name, Err: err}
		}
		return name, nil
	}
}

// syncDir fsyncs a directory, so the entries created or renamed in it
// survive a power loss.
func syncDir(dir string) error {
	return onDir(dir, "fsync", func(fd int) error {
		if err := unix.Fsync(fd); err != unix.EINVAL {
			return err
		}
		return nil
	})
}

// onDir opens dir and runs op (named opName in its error) on it.
func onDir(dir, opName string, op func(fd int) error) error {
	fd, err := rawio.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if err := op(fd); err != nil {
		return &fs.PathError{Op: opName, Path: dir, Err: err}
	}
	return nil
}
