package repocache

import (
	"context"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/internal/startstop"
)

// preparer prepares trees in the background, one at a time, while the
// cache runs (Start to Stop). It keeps at most one request per
// repository: the newest commit asked for.
type preparer struct {
	life startstop.Base

	mu      sync.Mutex
	pending map[string]treeReq // by repository key
	order   []string           // keys, oldest request first
	wake    chan struct{}      // one signal: pending has work
	cancel  context.CancelFunc
	done    chan struct{}
}

type treeReq struct{ repo, commit string }

// Start starts preparing trees (Config.Trees > 0) in the background. The
// cache serves (LsRemote, Link, TakeTree) whether it runs or not; until it
// runs, and once stopped, Prepare prepares nothing.
func (c *Cache) Start(ctx context.Context) error {
	return c.prep.life.Start(ctx, func(ctx context.Context) error {
		p := &c.prep
		p.mu.Lock()
		p.pending = map[string]treeReq{}
		p.wake = make(chan struct{}, 1)
		p.done = make(chan struct{})
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		p.cancel = cancel
		p.mu.Unlock()
		go c.prepareLoop(rctx)
		return nil
	})
}

// Stop stops preparing: a preparation under way is cancelled and what it
// made removed. ctx bounds the wait for it.
func (c *Cache) Stop(ctx context.Context) error {
	return c.prep.life.Stop(ctx, func(ctx context.Context) error {
		p := &c.prep
		p.mu.Lock()
		p.cancel()
		p.pending, p.order = nil, nil
		p.mu.Unlock()
		select {
		case <-p.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// Started is closed once Start succeeded.
func (c *Cache) Started() <-chan struct{} { return c.prep.life.Started() }

// Stopped is closed once Stop finished.
func (c *Cache) Stopped() <-chan struct{} { return c.prep.life.Stopped() }

// Prepare asks for Config.Trees trees of repo at commit, made in the
// background: call it once the cache served that commit to a job. It
// returns at once, and does nothing while the cache is not running or
// keeps no trees.
func (c *Cache) Prepare(repo, commit string) {
	if c.cfg.Trees == 0 || !IsSHA(commit) {
		return
	}
	p := &c.prep
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == nil {
		return // not running
	}
	k := key(repo)
	if _, queued := p.pending[k]; !queued {
		p.order = append(p.order, k)
	}
	p.pending[k] = treeReq{repo: repo, commit: commit}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// next takes the oldest request.
func (p *preparer) next() (treeReq, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.order) == 0 {
		return treeReq{}, false
	}
	k := p.order[0]
	p.order = p.order[1:]
	r := p.pending[k]
	delete(p.pending, k)
	return r, true
}

func (c *Cache) prepareLoop(ctx context.Context) {
	p := &c.prep
	defer close(p.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		for ctx.Err() == nil {
			r, ok := p.next()
			if !ok {
				break
			}
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
	}
}
