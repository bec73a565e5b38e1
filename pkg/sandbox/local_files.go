package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// checkPath validates a workspace-relative path lexically and returns it
// cleaned. Absolute paths and ".." escapes give ErrInvalid; symlink escapes
// are caught by os.Root when the path is used.
func (s *localSandbox) checkPath(path string) (string, error) {
	if strings.ContainsRune(path, 0) {
		return "", Invalidf("path %q holds a NUL byte", path)
	}
	if filepath.IsAbs(path) || !filepath.IsLocal(path) {
		return "", Invalidf("path %q is not a relative path inside the workspace", path)
	}
	return filepath.Clean(path), nil
}

// errPathEscapes is the (unexported) error os.Root returns for a path that
// leaves the root, learnt once by asking a Root for an absolute path.
var errPathEscapes = sync.OnceValue(func() error {
	r, err := os.OpenRoot("/")
	if err != nil {
		return nil
	}
	defer func() { _ = r.Close() }()
	_, err = r.Stat("/")
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return nil
})

// isEscape reports whether err says that a path left the workspace (through
// a symlink) or met a symlink loop.
func (s *localSandbox) isEscape(err error) bool {
	if esc := errPathEscapes(); esc != nil && errors.Is(err, esc) {
		return true
	}
	return errors.Is(err, syscall.ELOOP) || strings.Contains(err.Error(), "path escapes from parent")
}

// fileErr maps an error from a workspace file operation to the sentinels.
func (s *localSandbox) fileErr(op, path string, err error) error {
	prefix := fmt.Sprintf("sandbox: %s %q in sandbox %s", op, path, s.id)
	switch {
	case s.isEscape(err):
		return fmt.Errorf("%s: %w", prefix, Invalidf("path escapes the workspace"))
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: %w", prefix, ErrNotFound)
	case errors.Is(err, os.ErrClosed):
		return fmt.Errorf("%s: %w", prefix, ErrClosed)
	default:
		return fmt.Errorf("%s: %w", prefix, err)
	}
}

// fileOp runs fn on the workspace root unless the sandbox is closed.
func (s *localSandbox) fileOp(ctx context.Context, op, path string, fn func(name string) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox: %s %q in sandbox %s: %w", op, path, s.id, err)
	}
	name, err := s.checkPath(path)
	if err != nil {
		return fmt.Errorf("sandbox: %s in sandbox %s: %w", op, s.id, err)
	}
	s.fileMu.RLock()
	defer s.fileMu.RUnlock()
	if s.closed.Load() || s.root == nil {
		return fmt.Errorf("sandbox: %s %q in sandbox %s: %w", op, path, s.id, ErrClosed)
	}
	if err := fn(name); err != nil {
		return s.fileErr(op, path, err)
	}
	return nil
}

// WriteFile writes data to path (relative to the workspace), creating parent
// directories. Absolute paths, ".." and symlinks leading out of the workspace
// give ErrInvalid.
func (s *localSandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	return s.fileOp(ctx, "write file", path, func(name string) error {
		if dir := filepath.Dir(name); dir != "." {
			if err := s.root.MkdirAll(dir, 0o755); err != nil {
				return err
			}
		}
		if err := s.root.WriteFile(name, data, 0o644); err != nil {
			return err
		}
		return giveToAgent(s, name)
	})
}

// ReadFile reads path (relative to the workspace): ErrNotFound if absent,
// ErrInvalid if it escapes the workspace.
func (s *localSandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	var data []byte
	err := s.fileOp(ctx, "read file", path, func(name string) error {
		var err error
		data, err = s.root.ReadFile(name)
		return err
	})
	if err != nil {
		return nil, err
	}
	return data, nil
}

// Destroy stops every process (SIGTERM, KillGrace, then SIGKILL to each
// group), waits for them, and removes the sandbox directory. It is
// idempotent; a failed Destroy (ctx done, directory not removable) can be
// retried. After Destroy, Start, WriteFile and ReadFile return ErrClosed.
func (s *localSandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	if s.destroying != nil {
		ch := s.destroying
		s.mu.Unlock()
		select {
		case <-ch:
			return s.destroyErr
		case <-ctx.Done():
			return fmt.Errorf("sandbox: destroy %s: %w", s.id, ctx.Err())
		}
	}
	if s.destroyed {
		s.mu.Unlock()
		return nil
	}
	s.closed.Store(true)
	ch := make(chan struct{})
	s.destroying = ch
	procs := slices.Collect(maps.Values(s.procs))
	s.mu.Unlock()

	s.l.forget(s)
	err := s.destroy(ctx, procs)

	s.mu.Lock()
	s.destroyErr = err
	s.destroyed = err == nil
	s.destroying = nil // a later call retries after a failure, or returns nil
	s.mu.Unlock()
	close(ch)
	return err
}

func (s *localSandbox) destroy(ctx context.Context, procs []*localProcess) error {
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Go(func() { errs[i] = p.shutdown(ctx, s.l.cfg.KillGrace) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox: destroy %s: %w", s.id, err)
	}
	s.fileMu.Lock()
	if s.root != nil {
		_ = s.root.Close()
		s.root = nil
	}
	s.fileMu.Unlock()
	// Every process is gone: the tree is recycled when nothing was
	// written to it, else removed with the next batch (localpool.go).
	if err := s.l.pool.put(s.dir, s.readyAt); err != nil {
		if err := removeAll(s.dir); err != nil {
			return fmt.Errorf("sandbox: destroy %s: %w", s.id, err)
		}
	}
	s.log.Debug().Msg("sandbox destroyed")
	return nil
}

// removeAll removes dir. If that fails it makes every directory under dir
// writable and tries again: agents leave read-only trees behind (Go's module
// cache, for one). Symlinks are never followed.
func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
