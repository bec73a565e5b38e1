package workspace

// Prepared working trees (docs/warm.md): the repository cache keeps complete
// checkouts of a repository at the commit it served last (package
// repocache, TakeTree), and a checkout of that commit takes one instead of
// writing every file again.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// fromTree serves the checkout from a prepared tree of the commit c
// resolved, moved into c.dir (empty: nothing was written to it yet). It
// is called only after the job's credentials passed the remote. The tree
// must then be on the work branch at the commit and clean; one that is
// not (truncated, added to, its index gone) is removed and never served.
// done false means check out from the mirror, with c.dir empty again; an
// error, that c.dir could not be emptied.
func (w *Workspaces) fromTree(ctx context.Context, sb sandbox.Sandbox, spec Spec, c *cached, base Base) (_ Base, done bool, err error) {
	repo := spec.Workspace.Repo
	taken, err := w.cfg.Cache.TakeTree(repo, c.sha, c.dir)
	if !taken && err == nil {
		return base, false, nil
	}
	if err == nil {
		err = w.checkTree(ctx, sb, c, base.Branch)
	}
	if err != nil {
		w.log.Warn().Err(err).Str("tenant", spec.Tenant).Str("id", spec.ID).
			Msg("a prepared working tree was dropped; checking out from the repository cache")
		if err := emptyDir(c.dir); err != nil {
			return base, false, fmt.Errorf("removing a dropped prepared tree: %w", err)
		}
		return base, false, nil
	}
	base.Cache, base.StartSHA = CacheTree, c.sha
	return base, true, nil
}

// checkTree makes the tree moved into c.dir the job's checkout, as
// Checkout leaves one: the sandbox's (its owner's, when contained; the
// packs stay the cache's, as Link leaves them), the providers' files
// excluded, on branch at the commit, and verifies it: nothing modified,
// added or missing, by git's own reading of every file against the index.
func (w *Workspaces) checkTree(ctx context.Context, sb sandbox.Sandbox, c *cached, branch string) error {
	if err := ChownLike(c.dir, c.dir); err != nil {
		return err
	}
	if err := sb.WriteFile(ctx, ".git/info/exclude", []byte("/.fleet/\n")); err != nil {
		return err
	}
	if w.cfg.MaxBytes > 0 {
		size, err := w.objectBytes(ctx, sb)
		if err != nil {
			return err
		}
		if size > w.cfg.MaxBytes {
			return errors.New("the repository is over --workspace-max-bytes")
		}
	}
	if _, err := w.mustGit(ctx, sb, "checkout", "-c", "advice.detachedHead=false", "checkout", "-q", "-B", branch, c.sha); err != nil {
		return err
	}
	head, err := w.mustGit(ctx, sb, "resolve", "rev-parse", "--verify", "-q", "HEAD^{commit}")
	if err != nil {
		return err
	}
	if head != c.sha {
		return fmt.Errorf("the prepared tree is at %s, not %s", head, c.sha)
	}
	out, err := w.mustGit(ctx, sb, "verify", "status", "--porcelain", "--ignored", "--untracked-files=all")
	if err != nil {
		return err
	}
	if out != "" {
		first, _, _ := strings.Cut(out, "\n")
		return fmt.Errorf("the prepared tree is not clean (%d lines of git status, the first %q)", strings.Count(out, "\n")+1, first)
	}
	return nil
}

// emptyDir removes everything in dir, keeping dir itself (a contained
// sandbox may have it mounted).
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
