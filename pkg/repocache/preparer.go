package repocache

import (
	"context"
	"time"
)

// The trees are prepared in the background, one at a time, while the
// cache runs (Start to Stop), by a keyqueue.Queue that keeps at most one
// request per repository: the newest commit asked for.

type treeReq struct{ repo, commit string }

// Start starts preparing trees (Config.Trees > 0) in the background. The
// cache serves (LsRemote, Link, TakeTree) whether it runs or not; until it
// runs, and once stopped, Prepare prepares nothing.
func (c *Cache) Start(ctx context.Context) error {
	return c.prep.Start(ctx, func(ctx context.Context, _ string, r treeReq) { c.prepareOne(ctx, r) })
}

// Stop stops preparing: a preparation under way is cancelled and what it
// made removed. ctx bounds the wait for it.
func (c *Cache) Stop(ctx context.Context) error { return c.prep.Stop(ctx) }

// Started is closed once Start succeeded.
func (c *Cache) Started() <-chan struct{} { return c.prep.Started() }

// Stopped is closed once Stop finished.
func (c *Cache) Stopped() <-chan struct{} { return c.prep.Stopped() }

// Prepare asks for Config.Trees trees of repo at commit, made in the
// background: call it once the cache served that commit to a job. It
// returns at once, and does nothing while the cache is not running or
// keeps no trees.
func (c *Cache) Prepare(repo, commit string) {
	if c.cfg.Trees == 0 || !IsSHA(commit) {
		return
	}
	c.prep.Put(key(repo), treeReq{repo: repo, commit: commit})
}

// prepareOne prepares r's trees and reports it (the log, Config.Prepared).
func (c *Cache) prepareOne(ctx context.Context, r treeReq) {
	t0 := time.Now()
	built, err := c.prepare(ctx, r.repo, r.commit)
	ev := TreeEvent{Repo: r.repo, Commit: r.commit, Built: built, Took: time.Since(t0), Err: err}
	if err != nil {
		c.log.Warn().Err(err).Str("repo", redact(r.repo)).Str("commit", r.commit).
			Msg("repocache: preparing a working tree failed; the next job checks out from the mirror")
	} else if built > 0 {
		c.log.Info().Str("repo", redact(r.repo)).Str("commit", r.commit).Dur("took", ev.Took).
			Msg("repocache: working tree prepared")
	}
	if c.cfg.Prepared != nil {
		c.cfg.Prepared(ev)
	}
}
