//go:build !linux

package sandbox

import "os"

// privateDirNames reports whether path is a directory (not a symlink) of
// mode 0700, and its entries' names.
func privateDirNames(path string) (names []string, ok bool) {
	fi, err := os.Lstat(path)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		return nil, false
	}
	names, err = readNames(path)
	return names, err == nil
}
