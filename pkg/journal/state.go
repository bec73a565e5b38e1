package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// stateVersion is the version of the state file format.
const stateVersion = 1

// logState is the small state file kept next to each WAL. It is replaced
// atomically (write temp, fsync unless FsyncNever, rename, fsync dir).
type logState struct {
	V       int    `json:"v"`
	Tenant  string `json:"tenant"`
	ID      string `json:"id"`
	Attempt int    `json:"attempt"`
	// FlushedSeq is the last seq known to be in storage.
	FlushedSeq uint64 `json:"flushed_seq"`
	// Pending is the chunk being uploaded (recorded before its first Put),
	// so a retry or recovery re-puts exactly the same bytes under the same key.
	Pending *seqRange `json:"pending,omitempty"`
	Closed  bool      `json:"closed"`
	Final   bool      `json:"final"`
}

// seqRange is an inclusive range of seqs.
type seqRange struct {
	First uint64 `json:"first"`
	Last  uint64 `json:"last"`
}

// writeStateFile replaces path with st atomically.
func writeStateFile(path string, st logState, sync bool) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	tmp := path + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return fmt.Errorf("write state %s: %w", tmp, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return fmt.Errorf("fsync state %s: %w", tmp, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close state %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if sync {
		return syncDir(filepath.Dir(path))
	}
	return nil
}

// readStateFile reads path; found is false when it does not exist.
func readStateFile(path string) (st logState, found bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return logState{}, false, nil
	}
	if err != nil {
		return logState{}, false, fmt.Errorf("read state: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return logState{}, true, fmt.Errorf("decode state %s: %w", path, err)
	}
	if st.V != stateVersion {
		return logState{}, true, fmt.Errorf("decode state %s: unknown version %d", path, st.V)
	}
	return st, true, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync dir: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}
