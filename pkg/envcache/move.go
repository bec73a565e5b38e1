package envcache

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// want is what a path of a prepared copy must be.
type want struct {
	kind byte
	mode fs.FileMode
	size int64
}

// expected lists every path a prepared copy of items holds, with what
// place makes of it: a file has its mode with 0o600 under the process's
// umask (it is created with it), a directory its mode with 0o700 (it is
// chmodded), a directory made only as a parent 0o755 under the umask, a
// link is a link.
func expected(items []item) (map[string]want, error) {
	umask, err := processUmask()
	if err != nil {
		return nil, err
	}
	out := make(map[string]want, len(items))
	for _, it := range items {
		switch it.kind {
		case 'f':
			out[it.path] = want{kind: 'f', mode: (it.mode | 0o600) &^ umask, size: it.size}
		case 'd':
			out[it.path] = want{kind: 'd', mode: it.mode | 0o700}
		case 'l':
			out[it.path] = want{kind: 'l'}
		}
	}
	for _, it := range items {
		for d := path.Dir(it.path); d != "."; d = path.Dir(d) {
			if _, ok := out[d]; !ok {
				out[d] = want{kind: 'd', mode: 0o755 &^ umask}
			}
		}
	}
	return out, nil
}

// verifyTree checks that root holds exactly the paths of items (and their
// parent directories), each of its kind, mode and size, its links
// pointing where entry's do: nothing missing, extra, truncated or changed.
func verifyTree(root, entry string, items []item) error {
	exp, err := expected(items)
	if err != nil {
		return err
	}
	seen := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		w, ok := exp[rel]
		if !ok {
			return fmt.Errorf("%w: %s is not in the manifest", ErrCorrupt, rel)
		}
		seen++
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if !matches(fi, w) {
			return fmt.Errorf("%w: %s does not match the manifest", ErrCorrupt, rel)
		}
		if w.kind == 'l' {
			return sameLink(p, filepath.Join(entry, filepath.FromSlash(rel)), rel)
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			err = fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return err
	}
	if seen != len(exp) {
		return fmt.Errorf("%w: %d of the manifest's %d paths are missing", ErrCorrupt, len(exp)-seen, len(exp))
	}
	return nil
}

func matches(fi fs.FileInfo, w want) bool {
	switch w.kind {
	case 'f':
		return fi.Mode().IsRegular() && fi.Size() == w.size && fi.Mode().Perm() == w.mode
	case 'd':
		return fi.IsDir() && fi.Mode().Perm() == w.mode
	default:
		return fi.Mode()&fs.ModeSymlink != 0
	}
}

func sameLink(p, entry, rel string) error {
	got, err := os.Readlink(p)
	if err != nil {
		return err
	}
	exp, err := os.Readlink(entry)
	if err != nil || got != exp {
		return fmt.Errorf("%w: the link %s does not point where the entry's does", ErrCorrupt, rel)
	}
	return nil
}

// processUmask reads the process's umask from /proc/self/status (setting
// it to read it would race with files other goroutines create).
func processUmask() (fs.FileMode, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("envcache: reading the umask: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Umask:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			if err != nil {
				return 0, fmt.Errorf("envcache: reading the umask: %w", err)
			}
			return fs.FileMode(m) & 0o777, nil
		}
	}
	return 0, errors.New("envcache: reading the umask: /proc/self/status has no Umask line")
}

// moveInto moves the tree at src (a checked prepared copy) into workdir
// by rename(2): each highest path of src that workdir lacks is renamed
// whole; directories in both are descended into (and given their
// manifest's mode, as a copy would); a file or link in both is replaced.
// Every step goes through directory descriptors opened without following
// links, so a symbolic link in the checkout cannot redirect it: a link
// where the copy has a directory is an error, and the caller copies
// instead (which refuses links out of the checkout as before).
func moveInto(src, workdir string, items []item) error {
	dirModes := map[string]fs.FileMode{}
	for _, it := range items {
		if it.kind == 'd' {
			dirModes[it.path] = it.mode | 0o700
		}
	}
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sfd) // read only
	dfd, err := unix.Open(workdir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd) // read only
	return merge(sfd, dfd, src, "", dirModes)
}

// merge moves the entries of the directory srcFd (at srcPath) into dstFd;
// rel is their directory's path in the checkout ("" at its root).
func merge(srcFd, dstFd int, srcPath, rel string, dirModes map[string]fs.FileMode) error {
	des, err := os.ReadDir(srcPath)
	if err != nil {
		return err
	}
	for _, de := range des {
		name := de.Name()
		p := path.Join(rel, name)
		var st unix.Stat_t
		err := unix.Fstatat(dstFd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		switch {
		case errors.Is(err, unix.ENOENT):
			err = unix.Renameat2(srcFd, name, dstFd, name, unix.RENAME_NOREPLACE)
			if errors.Is(err, unix.EINVAL) { // a filesystem without RENAME_NOREPLACE
				err = unix.Renameat(srcFd, name, dstFd, name)
			}
		case err != nil:
		case de.IsDir() && st.Mode&unix.S_IFMT == unix.S_IFDIR:
			if err := descend(srcFd, dstFd, filepath.Join(srcPath, name), p, dirModes); err != nil {
				return err
			}
			continue
		case !de.IsDir() && st.Mode&unix.S_IFMT != unix.S_IFDIR:
			err = unix.Renameat(srcFd, name, dstFd, name)
		default:
			err = fmt.Errorf("%s is a directory in one of the checkout and the prepared copy and not in the other", p)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// descend merges the directory name present in both.
func descend(srcFd, dstFd int, srcPath, rel string, dirModes map[string]fs.FileMode) error {
	name := path.Base(rel)
	s, err := unix.Openat(srcFd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer unix.Close(s) // read only
	d, err := unix.Openat(dstFd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer unix.Close(d) // read only
	if err := merge(s, d, srcPath, rel, dirModes); err != nil {
		return err
	}
	if m, ok := dirModes[rel]; ok {
		if err := unix.Fchmod(d, uint32(m)); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
	return nil
}
