package envcache

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
)

// Key is the cache key of a setup: the hash of the repository URL, the
// script and the contents of its inputs (ParseInputs) read in workdir,
// the checkout. A missing input hashes as missing; an input that is not a
// regular file (a directory, a link out of the checkout) is an error.
func Key(repo, script, workdir string) (string, error) {
	inputs, err := ParseInputs(script)
	if err != nil {
		return "", err
	}
	root, err := os.OpenRoot(workdir)
	if err != nil {
		return "", fmt.Errorf("envcache: %w", err)
	}
	defer root.Close()
	h := sha256.New()
	field(h, []byte("agentfleet envcache v1"))
	field(h, []byte(repo))
	field(h, []byte(script))
	for _, in := range inputs {
		field(h, []byte(in))
		if err := hashInput(h, root, in); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// field writes b length-prefixed, so no two sequences of fields collide.
func field(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

func hashInput(h hash.Hash, root *os.Root, name string) error {
	f, err := root.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		field(h, []byte("missing"))
		return nil
	}
	if err != nil {
		return fmt.Errorf("envcache: input %s: %w", name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("envcache: input %s: %w", name, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("envcache: input %s is not a regular file", name)
	}
	fh := sha256.New()
	if _, err := io.Copy(fh, f); err != nil {
		return fmt.Errorf("envcache: input %s: %w", name, err)
	}
	field(h, []byte("file"))
	field(h, fh.Sum(nil))
	return nil
}
