package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// FS is a Store on a local directory, the default backend (file://./data).
// A key maps to the file <root>/<key>: ValidateKey guarantees that the path
// stays under root. Writes are atomic and durable: the value goes to a
// temporary file in the target directory, which is fsynced, renamed over the
// target, and the directory is fsynced, so a reader or a crash sees either the
// old value or the new one, never a mix.
//
// Temporary files are named "~tmp-*"; '~' is not a key character, so they
// never show up in List, and a crash can leave only such files behind.
//
// Because keys are paths, one key cannot also be a directory of others: with
// "a/b/c" stored, Put("a/b") fails with an error wrapping ErrInvalidKey (and
// the other way round). The fleet's key layout never does this. Delete leaves
// empty directories in place; they hold no keys and cost nothing.
//
// FS is safe for concurrent use by several goroutines and several processes
// on one machine; Create is atomic across processes (it uses link(2)).
type FS struct {
	root string
}

var (
	_ Store        = (*FS)(nil)
	_ Creator      = (*FS)(nil)
	_ StreamPutter = (*FS)(nil)
)

// NewFS returns an FS rooted at root, creating the directory if needed.
func NewFS(root string) (*FS, error) {
	if root == "" {
		return nil, errors.New("storage: fs: empty root directory")
	}
	root = filepath.Clean(root)
	if err := os.MkdirAll(root, 0o750); err != nil {
		return nil, fmt.Errorf("storage: fs: create root %s: %w", root, err)
	}
	st, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("storage: fs: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("storage: fs: root %s is not a directory", root)
	}
	return &FS{root: root}, nil
}

// Root returns the directory FS stores its files in.
func (s *FS) Root() string { return s.root }

func (s *FS) path(key string) string { return filepath.Join(s.root, filepath.FromSlash(key)) }

func (s *FS) begin(ctx context.Context, op, key string) (string, error) {
	if err := ValidateKey(key); err != nil {
		return "", fmt.Errorf("fs: %s: %w", op, err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("fs: %s %q: %w", op, key, err)
	}
	return s.path(key), nil
}

// Put implements Store.
func (s *FS) Put(ctx context.Context, key string, value []byte) error {
	p, err := s.begin(ctx, "put", key)
	if err != nil {
		return err
	}
	return s.write(ctx, "put", key, p, func(f *os.File) error {
		_, err := f.Write(value)
		return err
	}, false)
}

// PutStream implements StreamPutter: r is copied to a temporary file, so the
// value never has to fit in memory. If r fails, the previous value stays.
func (s *FS) PutStream(ctx context.Context, key string, r io.Reader) error {
	p, err := s.begin(ctx, "put", key)
	if err != nil {
		return err
	}
	return s.write(ctx, "put", key, p, func(f *os.File) error {
		_, err := io.Copy(f, ctxReader{ctx: ctx, r: r})
		return err
	}, false)
}

// Create implements Creator. The value is written and synced to a temporary
// file first and then hard-linked to the key, which fails if the key exists,
// so readers never see a partial value and exactly one of several concurrent
// Creates wins.
func (s *FS) Create(ctx context.Context, key string, value []byte) error {
	p, err := s.begin(ctx, "create", key)
	if err != nil {
		return err
	}
	return s.write(ctx, "create", key, p, func(f *os.File) error {
		_, err := f.Write(value)
		return err
	}, true)
}

// write fills a temporary file with fill, syncs it and moves it to p
// (rename, or link when exclusive), then syncs the directory.
func (s *FS) write(ctx context.Context, op, key, p string, fill func(*os.File) error, exclusive bool) (err error) {
	dir := filepath.Dir(p)
	var f *os.File
	if err := s.createIn(op, key, dir, true, func() (err error) {
		f, err = os.CreateTemp(dir, "~tmp-*")
		return err
	}); err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if f != nil {
			_ = f.Close()
		}
		if err != nil || exclusive {
			_ = os.Remove(tmp)
		}
	}()
	if err := fill(f); err != nil {
		return fmt.Errorf("fs: %s %q: write: %w", op, key, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fs: %s %q: sync: %w", op, key, err)
	}
	cerr := f.Close()
	f = nil
	if cerr != nil {
		return fmt.Errorf("fs: %s %q: close: %w", op, key, cerr)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fs: %s %q: %w", op, key, err)
	}
	if exclusive {
		if err := os.Link(tmp, p); err != nil {
			if errors.Is(err, fs.ErrExist) {
				if st, serr := os.Lstat(p); serr == nil && st.IsDir() {
					return s.conflict(op, key)
				}
				return fmt.Errorf("fs: create %q: %w", key, ErrExists)
			}
			return fmt.Errorf("fs: create %q: link: %w", key, err)
		}
	} else if err := os.Rename(tmp, p); err != nil {
		// An empty directory left by Delete may sit where the file goes.
		if st, serr := os.Lstat(p); serr == nil && st.IsDir() {
			if os.Remove(p) != nil {
				return s.conflict(op, key)
			}
			err = os.Rename(tmp, p)
		}
		if err != nil {
			return fmt.Errorf("fs: %s %q: rename: %w", op, key, err)
		}
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("fs: %s %q: sync dir: %w", op, key, err)
	}
	return nil
}

// mkdirsSync creates dir and its missing parents under the root. With
// sync it fsyncs the parent of every directory it creates, so a new key's
// directory entries survive a power loss along with the file; without, it
// leaves that to the caller (PutBatch syncs the whole filesystem
// afterwards). A path component that is a file fails with ENOTDIR.
func (s *FS) mkdirsSync(dir string, sync bool) error {
	st, err := os.Stat(dir)
	switch {
	case err == nil && st.IsDir():
		return nil
	case err == nil:
		return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	parent := filepath.Dir(dir)
	if dir != s.root && parent != dir {
		if err := s.mkdirsSync(parent, sync); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o750); err != nil {
		if !errors.Is(err, fs.ErrExist) {
			return err
		}
		// Created concurrently, or a file is in the way.
		if st, serr := os.Stat(dir); serr != nil || !st.IsDir() {
			return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		return nil
	}
	if !sync {
		return nil
	}
	return syncDir(parent)
}

// createIn runs create, which makes a file in dir. The directory usually
// exists, so it is made (with its parents; sync as in mkdirsSync) only
// when create finds it missing, and then create runs again. A file in
// dir's path gives the conflict error of key.
func (s *FS) createIn(op, key, dir string, sync bool, create func() error) error {
	err := create()
	if errors.Is(err, fs.ErrNotExist) {
		if err = s.mkdirsSync(dir, sync); err == nil {
			err = create()
		}
	}
	if errors.Is(err, syscall.ENOTDIR) {
		return s.conflict(op, key)
	}
	if err != nil {
		return fmt.Errorf("fs: %s %q: %w", op, key, err)
	}
	return nil
}

func (s *FS) conflict(op, key string) error {
	return fmt.Errorf("fs: %s %q: a stored key is a directory prefix of this one or the other way round (FS cannot hold both a/b and a/b/c): %w", op, key, ErrInvalidKey)
}

// Get implements Store.
func (s *FS) Get(ctx context.Context, key string) ([]byte, error) {
	p, err := s.begin(ctx, "get", key)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		if notFound(err) {
			return nil, fmt.Errorf("fs: get %q: %w", key, ErrNotFound)
		}
		return nil, fmt.Errorf("fs: get %q: %w", key, err)
	}
	return b, nil
}

func notFound(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EISDIR)
}

// Delete implements Store. A missing key, or a key that is only a directory
// of other keys, is not an error.
func (s *FS) Delete(ctx context.Context, key string) error {
	p, err := s.begin(ctx, "delete", key)
	if err != nil {
		return err
	}
	st, err := os.Lstat(p)
	if err != nil {
		if notFound(err) {
			return nil
		}
		return fmt.Errorf("fs: delete %q: %w", key, err)
	}
	if st.IsDir() {
		return nil
	}
	if err := os.Remove(p); err != nil && !notFound(err) {
		return fmt.Errorf("fs: delete %q: %w", key, err)
	}
	if err := syncDir(filepath.Dir(p)); err != nil {
		return fmt.Errorf("fs: delete %q: sync dir: %w", key, err)
	}
	return nil
}

// List implements Store. It walks only the directory named by prefix up to
// its last '/', so listing one query's chunks does not read the whole tree.
func (s *FS) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fs: list %q: %w", prefix, err)
	}
	dir, ok := prefixDir(prefix)
	if !ok {
		return nil, nil
	}
	start := s.root
	if dir != "" {
		start = s.path(strings.TrimSuffix(dir, "/"))
	}
	var keys []string
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if notFound(err) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == start {
			return nil // the prefix's directory itself (or a file, which is no directory of keys)
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !validSegment(d.Name()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			// Descend only where a key under this directory can match.
			if !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() && strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fs: list %q: %w", prefix, err)
	}
	slices.Sort(keys)
	return keys, nil
}

// Close implements Store; FS holds no resources.
func (s *FS) Close() error { return nil }

// ctxReader stops a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
