package envcache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultMaxBytes bounds the entries when Config.MaxBytes is 0.
const DefaultMaxBytes = 10 << 30

// usedFile's modification time is when the entry was last saved or served.
const usedFile = "fleet-used"

// Config configures a Cache.
type Config struct {
	// Dir holds the entries (the worker uses <--repo-cache>/envs).
	// Required; created when missing.
	Dir string
	// MaxBytes bounds the entries' total size, their prepared copies
	// included; 0 is DefaultMaxBytes.
	MaxBytes int64
	// Spares is how many prepared copies of each entry are kept ready to
	// be moved into a checkout (see the package documentation); 0 is
	// DefaultSpares, NoSpares (or any negative number) none.
	Spares int
}

// DefaultSpares is Config.Spares when it is 0: one prepared copy per
// entry.
const DefaultSpares = 1

// NoSpares as Config.Spares prepares no copies: every restore copies.
const NoSpares = -1

// Cache is a directory of saved environments, safe for concurrent use by
// goroutines and processes. Its background work (preparing copies) runs
// between Start and Stop; one owner (the worker) calls both.
type Cache struct {
	cfg  Config
	prep preparer
	// open is the shared flock on openLockFile held while this Cache may
	// write in the directory (until Stop); Open cleans up only when no
	// other holds it.
	openMu sync.Mutex
	open   *os.File
}

// Result says what a Save or Restore did.
type Result struct {
	Hit    bool  // Restore: the entry was there and served
	Files  int   // files, links and directories
	Bytes  int64 // bytes of file contents
	Cloned int   // files cloned copy-on-write rather than copied
	// Prepared (Restore): the files were moved into the checkout from a
	// copy prepared in the background, not copied.
	Prepared bool
}

// ErrTooLarge is a Save whose files pass Config.MaxBytes.
var ErrTooLarge = errors.New("envcache: the environment is larger than the cache")

var keyRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Open returns the cache in cfg.Dir.
func Open(cfg Config) (*Cache, error) {
	if cfg.Dir == "" {
		return nil, errors.New("envcache: Config.Dir is required")
	}
	if cfg.MaxBytes < 0 {
		return nil, errors.New("envcache: Config.MaxBytes must not be negative")
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	switch {
	case cfg.Spares == 0:
		cfg.Spares = DefaultSpares
	case cfg.Spares < 0:
		cfg.Spares = 0
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("envcache: %w", err)
	}
	c := &Cache{cfg: cfg}
	c.prep.Name = "envcache"
	if err := c.takeOpenLock(); err != nil {
		return nil, err
	}
	return c, nil
}

// openLockFile is flocked shared by every open Cache of the directory.
const openLockFile = "fleet-open.lock"

// takeOpenLock takes openLockFile. When no other Cache (of this process
// or another) has the directory open, what a killed one left is removed
// first: temporary entries, copies being prepared or claimed, and every
// prepared copy (made again on demand).
func (c *Cache) takeOpenLock() error {
	f, err := os.OpenFile(filepath.Join(c.cfg.Dir, openLockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("envcache: %w", err)
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
		c.removeLeftovers()
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		_ = f.Close()
		return fmt.Errorf("envcache: locking the directory: %w", err)
	}
	c.open = f
	return nil
}

// releaseOpenLock lets a later Open clean up (Stop calls it).
func (c *Cache) releaseOpenLock() {
	c.openMu.Lock()
	defer c.openMu.Unlock()
	if c.open != nil {
		_ = c.open.Close()
		c.open = nil
	}
}

// removeLeftovers removes what no open Cache is using: .tmp-, .trash-
// and .claimed- directories, and the spares directory.
func (c *Cache) removeLeftovers() {
	des, err := os.ReadDir(c.cfg.Dir)
	if err != nil {
		return
	}
	for _, de := range des {
		n := de.Name()
		if n == sparesDir || strings.HasPrefix(n, ".tmp-") || strings.HasPrefix(n, ".trash-") || strings.HasPrefix(n, claimedPrefix) {
			_ = os.RemoveAll(filepath.Join(c.cfg.Dir, n))
		}
	}
}

func (c *Cache) entry(key string) string { return filepath.Join(c.cfg.Dir, key) }

// Save stores the paths (relative to workdir, the checkout; directories
// are walked) under key, unless an entry is already there. Errors (a
// full disk, ErrTooLarge) leave no entry behind; the caller logs them and
// goes on.
func (c *Cache) Save(ctx context.Context, key, workdir string, paths []string) (Result, error) {
	if !keyRE.MatchString(key) {
		return Result{}, fmt.Errorf("envcache: %q is not a key", clip(key))
	}
	if _, err := os.Stat(filepath.Join(c.entry(key), manifestFile)); err == nil {
		touch(c.entry(key))
		c.want(key)
		return Result{}, nil
	}
	tmp := filepath.Join(c.cfg.Dir, ".tmp-"+random())
	res, err := c.write(ctx, tmp, workdir, paths)
	if err == nil {
		err = os.Rename(tmp, c.entry(key))
		if errors.Is(err, fs.ErrExist) || errors.Is(err, unixENOTEMPTY) {
			err = nil // another job saved it first
		}
	}
	_ = os.RemoveAll(tmp)
	if err != nil {
		return Result{}, fmt.Errorf("envcache: saving the environment: %w", err)
	}
	touch(c.entry(key))
	c.evict(key)
	c.want(key)
	return res, nil
}

// write copies the paths into dir and seals its manifest.
func (c *Cache) write(ctx context.Context, dir, workdir string, paths []string) (Result, error) {
	items, err := collect(workdir, paths)
	if err != nil {
		return Result{}, err
	}
	var res Result
	for _, it := range items {
		res.Bytes += it.size
	}
	if res.Bytes > c.cfg.MaxBytes {
		return Result{}, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, res.Bytes, c.cfg.MaxBytes)
	}
	src, err := os.OpenRoot(workdir)
	if err != nil {
		return Result{}, err
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Join(dir, "files"), 0o700); err != nil {
		return Result{}, err
	}
	dst, err := os.OpenRoot(filepath.Join(dir, "files"))
	if err != nil {
		return Result{}, err
	}
	defer dst.Close()
	for _, it := range items {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		cloned, err := place(dst, src, it)
		if err != nil {
			return Result{}, err
		}
		res.Files++
		if cloned {
			res.Cloned++
		}
	}
	if err := writeSynced(filepath.Join(dir, manifestFile), formatManifest(items)); err != nil {
		return Result{}, err
	}
	return res, nil
}

// collect lists the items of paths under workdir, walking directories,
// without following symbolic links.
func collect(workdir string, paths []string) ([]item, error) {
	root, err := os.OpenRoot(workdir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	seen := map[string]bool{}
	var items []item
	add := func(p string, fi fs.FileInfo) {
		if seen[p] {
			return
		}
		seen[p] = true
		it := item{mode: fi.Mode().Perm(), path: p}
		switch {
		case fi.Mode().IsRegular():
			it.kind, it.size = 'f', fi.Size()
		case fi.Mode()&fs.ModeSymlink != 0:
			it.kind = 'l'
		case fi.IsDir():
			it.kind = 'd'
		default:
			return // sockets, pipes, devices: not an environment's
		}
		items = append(items, it)
	}
	for _, p := range paths {
		if err := checkRel(p, 4096); err != nil {
			return nil, fmt.Errorf("path %q: %w", clip(p), err)
		}
		fi, err := root.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() { // a file, or a link kept as a link wherever it points
			add(p, fi)
			continue
		}
		err = fs.WalkDir(root.FS(), p, func(q string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := root.Lstat(q)
			if err != nil {
				return err
			}
			add(q, fi)
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	slices.SortFunc(items, func(a, b item) int { return cmpString(a.path, b.path) })
	return items, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func writeSynced(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func random() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func touch(dir string) {
	now := time.Now()
	p := filepath.Join(dir, usedFile)
	if err := os.Chtimes(p, now, now); err != nil {
		_ = os.WriteFile(p, nil, 0o600)
	}
}
