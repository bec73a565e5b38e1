//go:build !unix

package journal

import "errors"

// freeBytes is not known here: the journal then probes by writing.
func freeBytes(string) (int64, error) { return 0, errors.ErrUnsupported }
