package workspace

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// errNoCommit is the reason a ref that names no commit of the remote fails.
var errNoCommit = errors.New("the ref does not name a commit of the remote")

// cached is a checkout the repository cache may serve: the commit the
// remote resolved for the job's own credentials, those credentials, and
// the sandbox's working directory on this machine.
type cached struct {
	sha  string
	auth repocache.Auth
	dir  string
}

// resolveCached puts the job's own credentials to the remote (ls-remote,
// which also resolves the ref), when there is a cache and sb's working
// directory is on this machine: nothing of the cache is served before.
// nil means check out as without a cache (base.CacheCold says why, when
// the cache failed). An error is a permanent checkout failure the remote
// gave: credentials refused, no such ref.
func (w *Workspaces) resolveCached(ctx context.Context, sb sandbox.Sandbox, spec Spec, base *Base) (*cached, error) {
	hd, ok := sb.(sandbox.HostWorkDir)
	if w.cfg.Cache == nil || !ok {
		return nil, nil
	}
	ws := spec.Workspace
	key, value, err := w.auth(sb, ws)
	if err != nil {
		return nil, err
	}
	auth := repocache.Auth{Key: key, Value: value}
	sha, err := w.cfg.Cache.LsRemote(ctx, ws.Repo, ws.Ref, auth)
	switch {
	case errors.Is(err, repocache.ErrRefused):
		return nil, errors.New(w.refusal(sb, ws.Repo, key != ""))
	case errors.Is(err, repocache.ErrNoRef):
		return nil, errNoCommit
	case err != nil:
		w.cold(base, err)
		return nil, nil
	}
	return &cached{sha: sha, auth: auth, dir: hd.HostWorkDir()}, nil
}

// fromCache links the mirror's packs into the checkout (made by git init
// in c.dir), the mirror fetching what is new first. done false means check
// out as without a cache (base.CacheCold says why).
func (w *Workspaces) fromCache(ctx context.Context, spec Spec, c *cached, base *Base) (done bool, err error) {
	hit, err := w.cfg.Cache.Link(ctx, spec.Workspace.Repo, c.sha, c.auth, filepath.Join(c.dir, ".git", "objects", "pack"))
	switch {
	case errors.Is(err, repocache.ErrNoRef):
		return false, errNoCommit
	case err != nil:
		w.cold(base, err)
		return false, nil
	}
	base.Cache = CacheMiss
	if hit {
		base.Cache = CacheHit
	}
	return true, nil
}

// cold records that the cache could not serve a checkout, which goes on
// without it: a job never fails for its cache (a full disk, say).
func (w *Workspaces) cold(base *Base, err error) {
	base.Cache, base.CacheCold = CacheCold, err.Error()
	w.log.Warn().Err(err).Str("tenant", base.Spec.Tenant).Str("id", base.Spec.ID).
		Msg("the repository cache could not serve this checkout; fetching from the remote")
}
