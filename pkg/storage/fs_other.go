//go:build !linux

package storage

import (
	"errors"
	"os"
	"syscall"
)

const haveSyncfs = false

func (s *FS) syncAll() error { return nil }

// stage writes value to a new temporary file "~tmp-*" in dir, fsyncs it
// (there is no filesystem-wide sync to do it later) and returns its path.
func stage(dir string, value []byte) (string, error) {
	f, err := os.CreateTemp(dir, "~tmp-*")
	if err != nil {
		return "", err
	}
	_, err = f.Write(value)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// syncDir fsyncs a directory, so the entries created or renamed in it
// survive a power loss.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}
