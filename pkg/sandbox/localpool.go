package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The local provider's directory pool. A sandbox directory holds four
// directories (work, home, home/.claude, tmp): making them is five mkdirs
// per sandbox and removing them as many rmdirs and directory reads. A
// destroyed sandbox whose tree is exactly those four directories, empty,
// of mode 0700 and not symlinks (nothing the agent wrote, nothing it
// changed) is renamed into Root/.pool and handed to the next Create with
// one rename. Any other tree is renamed into Root/.trash; one Destroy at a
// time empties the trash, in one pass over it, until it finds it empty, so
// trees renamed there meanwhile by other Destroys are removed in the same
// batch (and NewLocal removes what a previous process left). Names starting with a dot are never
// sandbox IDs (CheckID), so the two directories cannot collide with one.
// Recycling happens only after every process of the sandbox has ended
// (Destroy), so nothing of one run reaches the next.
const (
	poolDir  = ".pool"
	trashDir = ".trash"
	poolMax  = 64
)

type dirPool struct {
	root string
	seq  atomic.Uint64

	mu       sync.Mutex
	free     []string // pristine trees under root/.pool
	emptying bool     // a Destroy is emptying the trash
}

// newDirPool prepares root/.pool and root/.trash, removing what a previous
// process left in them.
func newDirPool(root string) (*dirPool, error) {
	p := &dirPool{root: root}
	for _, d := range []string{poolDir, trashDir} {
		dir := filepath.Join(root, d)
		if err := removeAll(dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// take moves a pooled tree to dir and reports whether it did; dir must not
// exist (or be an empty directory).
func (p *dirPool) take(dir string) bool {
	p.mu.Lock()
	if len(p.free) == 0 {
		p.mu.Unlock()
		return false
	}
	src := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.mu.Unlock()
	if err := os.Rename(src, dir); err != nil {
		p.discard(src)
		return false
	}
	return true
}

// put recycles the tree at dir when it is pristine, else moves it to the
// trash and, unless another call is at it, empties the trash. readyAt is
// when the tree was handed out (zero: unknown). It returns an error only
// when dir could not be moved at all (the caller removes it then).
func (p *dirPool) put(dir string, readyAt time.Time) error {
	p.mu.Lock()
	room := len(p.free) < poolMax
	p.mu.Unlock()
	if room && !touchedSince(dir, readyAt) && pristine(dir) {
		dst := filepath.Join(p.root, poolDir, strconv.FormatUint(p.seq.Add(1), 10))
		if err := os.Rename(dir, dst); err == nil {
			p.mu.Lock()
			p.free = append(p.free, dst)
			p.mu.Unlock()
			return nil
		}
	}
	dst := filepath.Join(p.root, trashDir, strconv.FormatUint(p.seq.Add(1), 10))
	if err := os.Rename(dir, dst); err != nil {
		return err
	}
	p.mu.Lock()
	if p.emptying {
		p.mu.Unlock()
		return nil // the call emptying the trash removes it
	}
	p.emptying = true
	p.mu.Unlock()
	p.emptyTrash()
	return nil
}

// discard moves one tree to the trash (or removes it when it cannot).
func (p *dirPool) discard(dir string) {
	if err := p.put(dir, time.Time{}); err != nil {
		_ = removeAll(dir)
	}
}

// emptyTrash removes every tree in the trash, pass after pass, until a
// pass finds it empty (or cannot read it), then lets the next put empty it.
func (p *dirPool) emptyTrash() {
	dir := filepath.Join(p.root, trashDir)
	for {
		names, err := readNames(dir)
		if err != nil || len(names) == 0 {
			p.mu.Lock()
			if names2, err2 := readNames(dir); err == nil && err2 == nil && len(names2) > 0 {
				// Renamed in after the look, before this lock: go on.
				p.mu.Unlock()
				continue
			}
			p.emptying = false
			p.mu.Unlock()
			return
		}
		for _, n := range names {
			_ = removeAll(filepath.Join(dir, n))
		}
	}
}

// touchedSince reports whether the agent's config directory (where Claude
// Code always writes its session) was modified at or after t, from its
// mtime alone: one lstat, where pristine reads the directories. It never
// reports an untouched tree as touched: file times come from the kernel's
// coarse clock, which is never ahead of time.Now, so an mtime at or after t
// was set after t. A change it misses (within a clock tick of t) is found
// by pristine.
func touchedSince(dir string, t time.Time) bool {
	if t.IsZero() {
		return false
	}
	fi, err := os.Lstat(filepath.Join(dir, localClaudeDir))
	return err == nil && !fi.ModTime().Before(t)
}

// pristine reports whether dir holds exactly the four sandbox directories,
// empty, each a real directory of mode 0700.
func pristine(dir string) bool {
	// Most likely touched first (an agent's session files, then its work),
	// so a used sandbox is told apart in one or two reads.
	want := []struct {
		rel      string
		children []string
	}{
		{localClaudeDir, nil},
		{localWorkDir, nil},
		{localTmpDir, nil},
		{localHomeDir, []string{filepath.Base(localClaudeDir)}},
		{".", []string{localWorkDir, localHomeDir, localTmpDir}},
	}
	for _, w := range want {
		names, ok := privateDirNames(filepath.Join(dir, w.rel))
		if !ok || len(names) != len(w.children) {
			return false
		}
		for _, n := range names {
			if !slices.Contains(w.children, n) {
				return false
			}
		}
	}
	return true
}

func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}
