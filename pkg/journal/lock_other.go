//go:build !unix

package journal

import (
	"fmt"
	"os"
	"path/filepath"
)

// lockDir creates the lock file; without flock, exclusive use of Dir is
// the operator's responsibility.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal: lock Dir: %w", err)
	}
	return f, nil
}
