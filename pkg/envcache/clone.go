package envcache

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// copyFile makes dst's contents src's: a copy-on-write clone (FICLONE)
// where the filesystem allows, else a plain copy. It checks that exactly
// size bytes arrived, so a file truncated under it is noticed.
func copyFile(dst, src *os.File, size int64) (cloned bool, err error) {
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err == nil {
		st, err := dst.Stat()
		if err != nil {
			return true, err
		}
		if st.Size() != size {
			return true, fmt.Errorf("%w: %s is %d bytes, the manifest says %d", ErrCorrupt, src.Name(), st.Size(), size)
		}
		return true, nil
	}
	n, err := io.Copy(dst, io.LimitReader(src, size+1))
	if err != nil {
		return false, err
	}
	if n != size {
		return false, fmt.Errorf("%w: %s is %d bytes, the manifest says %d", ErrCorrupt, src.Name(), n, size)
	}
	return false, nil
}

// ErrCorrupt is an entry whose files do not match its sealed manifest. It
// was dropped; run the setup and save again.
var ErrCorrupt = errors.New("envcache: the cached environment is incomplete or corrupt")
