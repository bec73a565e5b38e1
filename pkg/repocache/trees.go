package repocache

// Prepared working trees: complete checkouts of a repository at the
// commit a job was last served, made in the background between jobs, that
// the next job of that commit takes instead of writing its files (see the
// package doc).

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Layout of a prepared tree: trees/<key>/<commit>.<random>.tree holds
// work/ (the checkout, its .git included) and sealFile. It is built as
// trees/<key>/.tmp-<random> and renamed into place once complete; a tree
// taken or dropped is first renamed out, to taken/<random> (the claim).
const (
	treeSuffix = ".tree"
	tmpPrefix  = ".tmp-"
	sealFile   = "fleet-tree"
)

// TreeEvent says how one preparation ended (Config.Prepared).
type TreeEvent struct {
	// Repo and Commit are what was prepared.
	Repo, Commit string
	// Built is the number of trees made (0: there were enough).
	Built int
	// Took is how long the preparation took.
	Took time.Duration
	// Err is why it failed (the trees made before it are kept).
	Err error
}

// treeInfo is a prepared tree found on disk.
type treeInfo struct {
	dir, commit string
	bytes       int64
	made        time.Time
}

func (c *Cache) treesDir(k string) string { return filepath.Join(c.cfg.Dir, "trees", k) }
func (c *Cache) takenDir() string         { return filepath.Join(c.cfg.Dir, "taken") }

// trees lists the sealed trees of the repository keyed k.
func (c *Cache) trees(k string) []treeInfo {
	dir := c.treesDir(k)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []treeInfo
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !strings.HasSuffix(name, treeSuffix) {
			continue
		}
		out = append(out, readTree(filepath.Join(dir, name)))
	}
	return out
}

// readTree reads a tree's seal. Its commit is empty (it is never taken,
// and goes when its repository's next tree is prepared) unless the seal
// names the commit its name does.
func readTree(dir string) treeInfo {
	t := treeInfo{dir: dir}
	fi, err := os.Stat(filepath.Join(dir, sealFile))
	if err != nil {
		return t
	}
	t.made = fi.ModTime()
	lines, _ := readLines(filepath.Join(dir, sealFile))
	if len(lines) != 1 {
		return t
	}
	sealed, size, _ := strings.Cut(lines[0], " ")
	t.bytes, _ = strconv.ParseInt(size, 10, 64)
	if named, _, _ := strings.Cut(filepath.Base(dir), "."); named == sealed && IsSHA(sealed) {
		t.commit = sealed
	}
	return t
}

// TakeTree moves a prepared tree of repo at commit into dst, an empty
// directory: its entries (.git included) are renamed into dst, which
// stays the directory it is. taken is false when there is none, or it
// cannot be moved there (another filesystem); dst is then as it was. An
// error means a tree was taken but could not be moved whole: dst holds
// part of it, and is the caller's to empty.
//
// Call it only once the job's own credentials passed the remote
// (LsRemote). A tree goes to one caller only: the rename that moves it
// out of the trees' directory is the claim.
func (c *Cache) TakeTree(repo, commit, dst string) (taken bool, err error) {
	k := key(repo)
	if c.cfg.Trees == 0 || !IsSHA(commit) || !sameDevice(c.treesDir(k), dst) {
		return false, nil
	}
	if entries, err := os.ReadDir(dst); err != nil || len(entries) > 0 {
		return false, nil
	}
	for _, t := range c.trees(k) {
		if t.commit != commit {
			continue
		}
		claim, release, err := scratch(c.takenDir(), "")
		if err != nil {
			return false, err
		}
		if err := os.Rename(t.dir, claim); err != nil {
			release() // another took it first
			continue
		}
		defer release()
		return moveInto(filepath.Join(claim, "work"), dst, t.dir, claim)
	}
	return false, nil
}

// moveInto renames the entries of work (a claimed tree, claim) into dst.
// When the first cannot go (another filesystem), the tree is put back at
// home.
func moveInto(work, dst, home, claim string) (bool, error) {
	entries, err := os.ReadDir(work)
	if err != nil {
		return false, fmt.Errorf("repocache: a taken tree: %w", err)
	}
	for i, e := range entries {
		err := os.Rename(filepath.Join(work, e.Name()), filepath.Join(dst, e.Name()))
		if err == nil {
			continue
		}
		if i == 0 {
			_ = os.Rename(claim, home)
			return false, nil
		}
		return true, fmt.Errorf("repocache: moving a taken tree: %w", err)
	}
	return true, nil
}

// discard removes a tree that must go (stale, evicted): claimed first, so
// no one takes it half-removed.
func (c *Cache) discard(dir string) {
	claim, release, err := scratch(c.takenDir(), "")
	if err != nil {
		return
	}
	defer release()
	_ = os.Rename(dir, claim)
}

// prepare makes sure the repository of repo has Config.Trees trees at
// commit, dropping its trees of other commits first, then evicts what is
// over the bound.
func (c *Cache) prepare(ctx context.Context, repo, commit string) (built int, err error) {
	k := key(repo)
	have := 0
	for _, t := range c.trees(k) {
		if t.commit == commit {
			have++
		} else {
			c.discard(t.dir)
		}
	}
	defer c.evict(k)
	for ; have < c.cfg.Trees; have++ {
		if err := c.buildTree(ctx, repo, commit); err != nil {
			return built, err
		}
		built++
	}
	return built, nil
}

// buildTree checks commit out from the mirror of repo into a new tree:
// objects borrowed as Link borrows them, origin the repository URL, no
// credentials, git run here with the cache's hardening.
func (c *Cache) buildTree(ctx context.Context, repo, commit string) error {
	k := key(repo)
	tmp, release, err := scratch(c.treesDir(k), tmpPrefix)
	if err != nil {
		return err
	}
	defer release()
	if c.onBuild != nil {
		c.onBuild(ctx, tmp)
	}
	work := filepath.Join(tmp, "work")
	if _, err := c.git(ctx, "", Auth{}, "init", "-q", "--initial-branch=fleet-init", work); err != nil {
		return err
	}
	if err := c.borrow(ctx, repo, commit, filepath.Join(work, ".git", "objects", "pack")); err != nil {
		return err
	}
	if _, err := c.git(ctx, work, Auth{}, "remote", "add", "origin", repo); err != nil {
		return err
	}
	if _, err := c.git(ctx, work, Auth{}, "checkout", "-q", "--detach", commit); err != nil {
		return err
	}
	if err := c.giveTree(ctx, work); err != nil {
		return err
	}
	size, err := treeBytes(work)
	if err != nil {
		return fmt.Errorf("repocache: %w", err)
	}
	seal := commit + " " + itoa(size) + "\n"
	if err := os.WriteFile(filepath.Join(tmp, sealFile), []byte(seal), 0o600); err != nil {
		return fmt.Errorf("repocache: %w", err)
	}
	final := filepath.Join(c.treesDir(k), commit+"."+filepath.Base(tmp)[len(tmpPrefix):]+treeSuffix)
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("repocache: %w", err)
	}
	return nil
}

// borrow links the packs of the mirror of repo, which must hold commit,
// into packDir, under the mirror's shared lock.
func (c *Cache) borrow(ctx context.Context, repo, commit, packDir string) error {
	m := c.mirror(repo)
	unlock, err := m.lock(ctx, unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer unlock()
	packs, err := m.verified()
	if err != nil {
		return err
	}
	if !c.has(ctx, m, commit) {
		return fmt.Errorf("%w: %s is not in the mirror", ErrNoRef, commit)
	}
	return linkPacks(m.dir, packs, packDir)
}

// giveTree gives a tree's files, but the packs (the mirror's hard links),
// to Config.TreeOwner, then refreshes its index (the chown changed every
// file's ctime) and gives the new index too.
func (c *Cache) giveTree(ctx context.Context, work string) error {
	uid := c.cfg.TreeOwner
	if uid <= 0 || os.Geteuid() != 0 {
		return nil
	}
	if err := chownTree(work, uid); err != nil {
		return err
	}
	if _, err := c.git(ctx, work, Auth{}, "-c", "safe.directory=*", "update-index", "-q", "--refresh"); err != nil {
		return err
	}
	return chownTree(work, uid)
}

// chownTree gives a tree to uid (and the group of that number).
func chownTree(work string, uid int) error {
	if err := GiveTo(work, uid, uid); err != nil {
		return fmt.Errorf("repocache: giving a tree to uid %d: %w", uid, err)
	}
	return nil
}

// GiveTo gives everything under root that is not uid:gid's to uid:gid,
// but regular files with more than one link: the packs a checkout or a
// tree borrows from the cache are its hard links, and chowning one would
// give the new owner (a contained agent) the cache's own copy. Links are
// chowned themselves, never followed.
func GiveTo(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || (d.Type().IsRegular() && st.Nlink > 1) || (int(st.Uid) == uid && int(st.Gid) == gid) {
			return nil
		}
		return os.Lchown(p, uid, gid)
	})
}

// treeBytes is what a tree adds to the cache: every file but the packs,
// which are the mirror's (counted there).
func treeBytes(work string) (int64, error) {
	packs := filepath.Join(work, ".git", "objects", "pack")
	var n int64
	err := filepath.WalkDir(work, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == packs {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// cleanScratch removes what owners that died left: trees half-built,
// trees taken or dropped half-way.
func (c *Cache) cleanScratch() {
	removeAbandoned(c.takenDir(), func(string) bool { return false })
	keys, err := os.ReadDir(filepath.Join(c.cfg.Dir, "trees"))
	if err != nil {
		return
	}
	for _, k := range keys {
		if k.IsDir() {
			removeAbandoned(c.treesDir(k.Name()), func(name string) bool {
				return !strings.HasPrefix(name, tmpPrefix)
			})
		}
	}
}
