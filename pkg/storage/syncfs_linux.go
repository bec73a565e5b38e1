package storage

import (
	"os"

	"golang.org/x/sys/unix"
)

// haveSyncfs: syncfs(2) flushes every dirty page and inode of the
// filesystem holding the root in one call.
const haveSyncfs = true

func (s *FS) syncAll() error {
	d, err := os.Open(s.root)
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Syncfs(int(d.Fd()))
}
