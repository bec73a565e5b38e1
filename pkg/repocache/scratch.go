package repocache

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A scratch directory is one that a single owner works in for a while: a
// tree being prepared (trees/<key>/.tmp-*) or one taken or dropped
// (taken/*). Its owner holds an exclusive flock of <dir>.lock for as long
// as it works there, so a process that opens the cache (a restarted
// worker, or a second one sharing the directory) removes what an owner
// that died left behind, and nothing that a live one still works in.

const lockSuffix = ".lock"

// scratch creates the lock of a new scratch directory under parent (the
// directory itself is the owner's to make) and returns its path and the
// func that removes it and its lock.
func scratch(parent, prefix string) (dir string, release func(), err error) {
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", nil, fmt.Errorf("repocache: %w", err)
	}
	for range 8 {
		var rnd [8]byte
		_, _ = rand.Read(rnd[:])
		dir = filepath.Join(parent, prefix+hex.EncodeToString(rnd[:]))
		f, ok, err := lockFile(dir+lockSuffix, false)
		if err != nil {
			return "", nil, err
		}
		if !ok {
			continue
		}
		return dir, func() {
			_ = os.RemoveAll(dir)
			_ = os.Remove(dir + lockSuffix)
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			_ = f.Close()
		}, nil
	}
	return "", nil, errors.New("repocache: no free scratch name")
}

// lockFile opens and exclusively flocks name, creating it. ok is false
// when another holds it, or when the file was removed or replaced while
// this one waited for it (its holder had released it, removing it): the
// lock is good only on the file the name still names.
func lockFile(name string, nonblock bool) (_ *os.File, ok bool, err error) {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("repocache: %w", err)
	}
	how := unix.LOCK_EX
	if nonblock {
		how |= unix.LOCK_NB
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("repocache: %w", err)
	}
	// A lock on a file someone removed (or replaced) since it was opened
	// guards nothing: not locked, as when another holds it.
	if !stillNamed(f, name) {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		_ = f.Close()
		return nil, false, nil
	}
	return f, true, nil
}

// removeAbandoned removes, under parent, the scratch directories (and
// stray locks) whose owner is gone: those whose lock no one holds. keep
// says which entries are not scratch (live trees, say).
func removeAbandoned(parent string, keep func(name string) bool) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if keep(name) {
			continue
		}
		dir := filepath.Join(parent, strings.TrimSuffix(name, lockSuffix))
		if strings.HasSuffix(name, lockSuffix) {
			if _, err := os.Lstat(dir); err == nil {
				continue // handled with its directory
			}
		}
		f, ok, err := lockFile(dir+lockSuffix, true)
		if err != nil || !ok {
			continue
		}
		_ = os.RemoveAll(dir)
		_ = os.Remove(dir + lockSuffix)
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		_ = f.Close()
	}
}

// sameDevice reports whether a and b are on one filesystem (a rename
// between them can work).
func sameDevice(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	if err1 != nil || err2 != nil {
		return false
	}
	da, ok1 := sa.Sys().(*syscall.Stat_t)
	db, ok2 := sb.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && da.Dev == db.Dev
}

// stillNamed reports whether name still names the open file f.
func stillNamed(f *os.File, name string) bool {
	held, err := f.Stat()
	if err != nil {
		return false
	}
	named, err := os.Stat(name)
	return err == nil && os.SameFile(held, named)
}
