package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// PutBatch implements Batcher. Every value goes to a temporary file beside
// its key (no fsync), then one sync of the whole filesystem makes them
// durable, then every temporary file is renamed over its key and a second
// filesystem sync makes the renames (and any new directories) durable. So
// a batch costs two syncs, however many objects it holds, and a crash
// leaves each key with its old value or its new one, never a torn file.
// Where the system has no filesystem-wide sync, every file and directory
// is fsynced instead (the same guarantee at the per-file price). A key's
// directory is made only when staging finds it missing, so a batch into
// existing directories costs an open, a write, a close and a rename per
// object (on Linux without os.File, whose poller setup costs more calls
// than that).
func (s *FS) PutBatch(ctx context.Context, objs []Object) (err error) {
	type staged struct{ key, path, tmp string }
	done := make([]staged, 0, len(objs))
	defer func() {
		for _, st := range done {
			if st.tmp != "" {
				_ = os.Remove(st.tmp)
			}
		}
	}()
	dirs := map[string]bool{}
	for _, o := range objs {
		p, err := s.begin(ctx, "put", o.Key)
		if err != nil {
			return err
		}
		dir := filepath.Dir(p)
		var tmp string
		if err := s.createIn("put", o.Key, dir, !haveSyncfs, func() (err error) {
			tmp, err = stage(dir, o.Value)
			return err
		}); err != nil {
			return err
		}
		if !haveSyncfs {
			dirs[dir] = true // fsynced after the renames
		}
		done = append(done, staged{key: o.Key, path: p, tmp: tmp})
	}
	if err := s.syncAll(); err != nil {
		return fmt.Errorf("fs: put batch: sync: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fs: put batch: %w", err)
	}
	for i := range done {
		st := &done[i]
		if err := os.Rename(st.tmp, st.path); err != nil {
			if fi, serr := os.Lstat(st.path); serr == nil && fi.IsDir() {
				if os.Remove(st.path) != nil {
					return s.conflict("put", st.key)
				}
				err = os.Rename(st.tmp, st.path)
			}
			if err != nil {
				return fmt.Errorf("fs: put %q: rename: %w", st.key, err)
			}
		}
		st.tmp = ""
	}
	if haveSyncfs {
		return s.syncAll()
	}
	for dir := range dirs {
		if err := syncDir(dir); err != nil {
			return fmt.Errorf("fs: put batch: sync dir: %w", err)
		}
	}
	return nil
}
