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
	"time"
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
	// MaxBytes bounds the entries' total size; 0 is DefaultMaxBytes.
	MaxBytes int64
}

// Cache is a directory of saved environments, safe for concurrent use by
// goroutines and processes.
type Cache struct {
	cfg Config
}

// Result says what a Save or Restore did.
type Result struct {
	Hit    bool  // Restore: the entry was there and served
	Files  int   // files, links and directories
	Bytes  int64 // bytes of file contents
	Cloned int   // files cloned copy-on-write rather than copied
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
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("envcache: %w", err)
	}
	return &Cache{cfg: cfg}, nil
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
