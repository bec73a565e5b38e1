package repocache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// completeFile lists a sealed mirror's packs, one "name size" a line.
const completeFile = "fleet-complete"

// usedFile's modification time is when the mirror was last served.
const usedFile = "fleet-used"

// errCorrupt is a mirror whose packs do not match its list, or that has
// none (never sealed, or a fetch died in it).
var errCorrupt = errors.New("repocache: the mirror is incomplete or corrupt")

type mirror struct {
	key, dir, lockPath string
}

func (c *Cache) mirror(repo string) mirror {
	k := key(repo)
	return mirror{key: k, dir: filepath.Join(c.cfg.Dir, "mirrors", k+".git"), lockPath: filepath.Join(c.cfg.Dir, "mirrors", k+".lock")}
}

// lock takes the mirror's flock (unix.LOCK_SH or LOCK_EX), waiting until
// ctx ends; the returned func releases it. The lock is on an open file
// description of its own, so goroutines of one process exclude each other
// as processes do.
func (m mirror) lock(ctx context.Context, how int) (func(), error) {
	f, err := os.OpenFile(m.lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("repocache: %w", err)
	}
	wait := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); _ = f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("repocache: locking a mirror: %w", err)
		}
		// flock has no deadline of its own; the holder is a fetch or a
		// link of this machine, so a short poll bounded by ctx is enough.
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			_ = f.Close()
			return nil, fmt.Errorf("repocache: waiting for a mirror: %w", ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// packs lists the mirror's pack files (.pack, .idx, .rev) with sizes.
func (m mirror) packs() (map[string]int64, error) {
	entries, err := os.ReadDir(filepath.Join(m.dir, "objects", "pack"))
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "pack-") {
			continue
		}
		switch filepath.Ext(name) {
		case ".pack", ".idx", ".rev":
		default:
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		out[name] = fi.Size()
	}
	return out, nil
}

// verified returns the sealed mirror's pack files, or errCorrupt (wrapped)
// when the files on disk are not the ones its list names, with their
// sizes, or when it has no list.
func (m mirror) verified() ([]string, error) {
	lines, err := readLines(filepath.Join(m.dir, completeFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errCorrupt, err)
	}
	have, err := m.packs()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errCorrupt, err)
	}
	if len(lines) != len(have) {
		return nil, fmt.Errorf("%w: %d pack files listed, %d present", errCorrupt, len(lines), len(have))
	}
	names := make([]string, 0, len(lines))
	for _, l := range lines {
		name, size, _ := strings.Cut(l, " ")
		n, err := strconv.ParseInt(size, 10, 64)
		if err != nil || have[name] != n {
			return nil, fmt.Errorf("%w: %s is %d bytes, listed as %s", errCorrupt, name, have[name], size)
		}
		names = append(names, name)
	}
	return names, nil
}

// seal writes the list of the mirror's packs, making it servable.
func (m mirror) seal() error {
	have, err := m.packs()
	if err != nil {
		return fmt.Errorf("repocache: %w", err)
	}
	names := make([]string, 0, len(have))
	for n := range have {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		b.WriteString(n + " " + itoa(have[n]) + "\n")
	}
	tmp := filepath.Join(m.dir, completeFile+".new")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("repocache: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, completeFile)); err != nil {
		return fmt.Errorf("repocache: %w", err)
	}
	m.touch()
	return nil
}

// drop removes the mirror (its holder has the exclusive lock).
func (m mirror) drop() error {
	if _, err := os.Stat(m.dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	old := m.dir + ".old-" + hex.EncodeToString(rnd[:])
	if err := os.Rename(m.dir, old); err != nil {
		return fmt.Errorf("repocache: dropping a mirror: %w", err)
	}
	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("repocache: dropping a mirror: %w", err)
	}
	return nil
}

// touch records that the mirror was served now.
func (m mirror) touch() {
	p := filepath.Join(m.dir, usedFile)
	now := time.Now()
	if err := os.Chtimes(p, now, now); err != nil {
		_ = os.WriteFile(p, nil, 0o600)
	}
}

// size is the sealed mirror's pack bytes (0 when it has no list).
func (m mirror) size() int64 {
	lines, _ := readLines(filepath.Join(m.dir, completeFile))
	var n int64
	for _, l := range lines {
		_, s, _ := strings.Cut(l, " ")
		v, _ := strconv.ParseInt(s, 10, 64)
		n += v
	}
	return n
}

// linkPacks hard-links the named pack files of mirrorDir into packDir,
// copying where a link cannot be made (another filesystem). The index of
// each pack goes last, so git never sees an index without its pack.
func linkPacks(mirrorDir string, names []string, packDir string) error {
	if err := os.MkdirAll(packDir, 0o755); err != nil {
		return fmt.Errorf("repocache: %w", err)
	}
	slices.SortFunc(names, func(a, b string) int {
		rank := func(n string) int {
			if strings.HasSuffix(n, ".idx") {
				return 1
			}
			return 0
		}
		return rank(a) - rank(b)
	})
	for _, n := range names {
		src := filepath.Join(mirrorDir, "objects", "pack", n)
		dst := filepath.Join(packDir, n)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		if err := os.Link(src, dst); err == nil {
			continue
		}
		if err := copyFile(src, dst); err != nil {
			return fmt.Errorf("repocache: borrowing %s: %w", n, err)
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o444)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := out.Close(); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}

// evict removes least recently used mirrors and trees until they fit in
// MaxBytes: never the mirror keyed keep, nor one somebody holds. A
// mirror's trees go with it.
func (c *Cache) evict(keep string) {
	all, total := c.evictable()
	slices.SortFunc(all, func(a, b evictee) int { return a.used.Compare(b.used) })
	gone := map[string]bool{}
	for _, e := range all {
		if total <= c.cfg.MaxBytes {
			return
		}
		switch {
		case gone[e.tree]:
		case e.tree != "":
			c.discard(e.tree)
			total -= e.size
		case e.m.key != keep && e.m.dropIdle():
			total -= e.size
			for _, t := range c.trees(e.m.key) {
				c.discard(t.dir)
				total -= t.bytes
				gone[t.dir] = true
			}
		}
	}
}

// evictee is a mirror (tree empty) or a tree that eviction may remove.
type evictee struct {
	m    mirror
	tree string
	size int64
	used time.Time
}

// evictable lists the mirrors and trees, and their total size.
func (c *Cache) evictable() (all []evictee, total int64) {
	dir := filepath.Join(c.cfg.Dir, "mirrors")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !strings.HasSuffix(name, ".git") {
			continue
		}
		k := strings.TrimSuffix(name, ".git")
		m := mirror{key: k, dir: filepath.Join(dir, name), lockPath: filepath.Join(dir, k+".lock")}
		var used time.Time
		if fi, err := os.Stat(filepath.Join(m.dir, usedFile)); err == nil {
			used = fi.ModTime()
		}
		all = append(all, evictee{m: m, size: m.size(), used: used})
	}
	keys, _ := os.ReadDir(filepath.Join(c.cfg.Dir, "trees"))
	for _, k := range keys {
		for _, t := range c.trees(k.Name()) {
			all = append(all, evictee{tree: t.dir, size: t.bytes, used: t.made})
		}
	}
	for _, e := range all {
		total += e.size
	}
	return all, total
}

// dropIdle drops m if no one holds it.
func (m mirror) dropIdle() bool {
	f, err := os.OpenFile(m.lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false
	}
	defer func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN) }()
	return m.drop() == nil
}
