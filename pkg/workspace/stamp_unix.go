//go:build unix

package workspace

import (
	"os"
	"syscall"
)

func stampOf(fi os.FileInfo) fileStamp {
	st := fileStamp{mod: fi.ModTime(), size: fi.Size()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = uint64(sys.Ino) //nolint:unconvert // Ino is not uint64 on every unix
	}
	return st
}
