package envcache

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

const unixENOTEMPTY = unix.ENOTEMPTY

// Restore puts the entry of key back into workdir (the checkout): from a
// prepared copy when one is ready on workdir's filesystem (claimed,
// checked, moved in: Result.Prepared), else by copying. Either way it
// then asks for a prepared copy for the next restore. A
// missing entry is a miss (Result.Hit false, no error). An entry that
// does not match its sealed manifest is dropped and ErrCorrupt returned:
// the caller runs the setup as on a miss and saves again. Any other
// error may leave part of the files restored; running the setup over them
// is what the caller does then too.
func (c *Cache) Restore(ctx context.Context, key, workdir string) (Result, error) {
	if !keyRE.MatchString(key) {
		return Result{}, fmt.Errorf("envcache: %q is not a key", clip(key))
	}
	unlock, err := c.lock(key, unix.LOCK_SH)
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	dir := c.entry(key)
	manifest, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Result{}, nil
	}
	var items []item
	if err == nil {
		items, _, err = parseManifest(bufio.NewScanner(bytes.NewReader(manifest)))
	}
	if err == nil {
		if res, ok := c.restoreSpare(key, workdir, manifest, items); ok {
			touch(dir)
			c.want(key)
			return res, nil
		}
		err = verify(dir, items)
	}
	if err != nil {
		c.drop(key)
		if !errors.Is(err, ErrCorrupt) {
			err = fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return Result{}, err
	}
	res, err := restoreItems(ctx, dir, workdir, items)
	if errors.Is(err, ErrCorrupt) {
		c.drop(key)
	} else {
		c.want(key)
	}
	if err != nil {
		return Result{}, err
	}
	touch(dir)
	res.Hit = true
	return res, nil
}

func restoreItems(ctx context.Context, dir, workdir string, items []item) (Result, error) {
	src, err := os.OpenRoot(filepath.Join(dir, "files"))
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	defer src.Close()
	dst, err := os.OpenRoot(workdir)
	if err != nil {
		return Result{}, fmt.Errorf("envcache: %w", err)
	}
	defer dst.Close()
	var res Result
	for _, it := range items {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		cloned, err := place(dst, src, it)
		if err != nil {
			return Result{}, fmt.Errorf("envcache: restoring %s: %w", it.path, err)
		}
		res.Files++
		res.Bytes += it.size
		if cloned {
			res.Cloned++
		}
	}
	return res, nil
}

// verify checks that every item of the manifest is in the entry with its
// kind and size.
func verify(dir string, items []item) error {
	files := filepath.Join(dir, "files")
	for _, it := range items {
		fi, err := os.Lstat(filepath.Join(files, filepath.FromSlash(it.path)))
		if err != nil {
			return fmt.Errorf("%w: %s is missing", ErrCorrupt, it.path)
		}
		ok := false
		switch it.kind {
		case 'f':
			ok = fi.Mode().IsRegular() && fi.Size() == it.size
		case 'l':
			ok = fi.Mode()&fs.ModeSymlink != 0
		case 'd':
			ok = fi.IsDir()
		}
		if !ok {
			return fmt.Errorf("%w: %s does not match the manifest", ErrCorrupt, it.path)
		}
	}
	return nil
}

// place makes it at dst as it is at src: a directory, a symbolic link (its
// target kept as written) or a file (cloned or copied, never linked).
func place(dst, src *os.Root, it item) (cloned bool, err error) {
	if dir := path.Dir(it.path); dir != "." {
		if err := dst.MkdirAll(dir, 0o755); err != nil {
			return false, err
		}
	}
	if it.kind == 'd' {
		if err := dst.MkdirAll(it.path, 0o755); err != nil {
			return false, err
		}
		return false, dst.Chmod(it.path, it.mode|0o700)
	}
	if fi, err := dst.Lstat(it.path); err == nil && !fi.IsDir() {
		if err := dst.Remove(it.path); err != nil {
			return false, err
		}
	}
	if it.kind == 'l' {
		target, err := src.Readlink(it.path)
		if err != nil {
			return false, err
		}
		return false, dst.Symlink(target, it.path)
	}
	in, err := src.OpenFile(it.path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := dst.OpenFile(it.path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, it.mode|0o600)
	if err != nil {
		return false, err
	}
	cloned, err = copyFile(out, in, it.size)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return cloned, err
}

// lock takes key's flock (LOCK_SH to read, LOCK_EX to remove), waiting.
func (c *Cache) lock(key string, how int) (func(), error) {
	f, err := os.OpenFile(filepath.Join(c.cfg.Dir, key+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("envcache: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("envcache: locking an entry: %w", err)
	}
	return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); _ = f.Close() }, nil
}

// drop removes an entry and its prepared copies: renamed away first, so
// no reader finds half of it.
func (c *Cache) drop(key string) {
	trash := filepath.Join(c.cfg.Dir, ".trash-"+random())
	if os.Rename(c.entry(key), trash) == nil {
		_ = os.RemoveAll(trash)
	}
	c.dropSpares(key)
}

// ent is an entry as evict and usage see it.
type ent struct {
	key    string
	size   int64 // by its manifest
	used   int64 // last saved or served, ns
	spares int   // its prepared copies
}

// entries lists the sealed entries, least recently used first.
func (c *Cache) entries() []ent {
	des, err := os.ReadDir(c.cfg.Dir)
	if err != nil {
		return nil
	}
	var ents []ent
	for _, de := range des {
		if !de.IsDir() || !keyRE.MatchString(de.Name()) {
			continue
		}
		dir := c.entry(de.Name())
		_, size, err := readManifest(filepath.Join(dir, manifestFile))
		if err != nil {
			continue
		}
		var used int64
		if fi, err := os.Stat(filepath.Join(dir, usedFile)); err == nil {
			used = fi.ModTime().UnixNano()
		}
		ents = append(ents, ent{de.Name(), size, used, len(c.spares(de.Name()))})
	}
	slices.SortFunc(ents, func(a, b ent) int { return int(min(max(a.used-b.used, -1), 1)) })
	return ents
}

// evict brings the total (entries and prepared copies) within MaxBytes:
// prepared copies go first, least recently used entry first, then the
// least recently used entries (never keep, never one being restored).
func (c *Cache) evict(keep string) {
	ents := c.entries()
	var total int64
	for _, e := range ents {
		total += e.size * int64(1+e.spares)
	}
	for _, e := range ents {
		if total <= c.cfg.MaxBytes {
			return
		}
		if e.spares > 0 {
			c.dropSpares(e.key)
			total -= e.size * int64(e.spares)
		}
	}
	for _, e := range ents {
		if total <= c.cfg.MaxBytes {
			return
		}
		if e.key == keep {
			continue
		}
		f, err := os.OpenFile(filepath.Join(c.cfg.Dir, e.key+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			c.drop(e.key)
			total -= e.size
		}
		_ = f.Close()
	}
}
