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

// fromCache serves the checkout from the repository cache, when there is
// one and sb's working directory is on this machine: the job's own
// credentials are put to the remote first (ls-remote, which also resolves
// the ref), and only then are the mirror's packs linked into the checkout.
// It returns the commit to check out and done; done false means check out
// as without a cache (base.CacheCold says why, when the cache failed). An
// error is a permanent checkout failure the remote gave: credentials
// refused, no such ref.
func (w *Workspaces) fromCache(ctx context.Context, sb sandbox.Sandbox, spec Spec, base *Base) (sha string, done bool, err error) {
	hd, ok := sb.(sandbox.HostWorkDir)
	if w.cfg.Cache == nil || !ok {
		return "", false, nil
	}
	ws := spec.Workspace
	key, value, err := w.auth(sb, ws.Repo)
	if err != nil {
		return "", false, err
	}
	auth := repocache.Auth{Key: key, Value: value}
	sha, err = w.cfg.Cache.LsRemote(ctx, ws.Repo, ws.Ref, auth)
	switch {
	case errors.Is(err, repocache.ErrRefused):
		return "", false, errors.New(w.refusal(sb, ws.Repo, key != ""))
	case errors.Is(err, repocache.ErrNoRef):
		return "", false, errNoCommit
	case err != nil:
		w.cold(base, err)
		return "", false, nil
	}
	hit, err := w.cfg.Cache.Link(ctx, ws.Repo, sha, auth, filepath.Join(hd.HostWorkDir(), ".git", "objects", "pack"))
	switch {
	case errors.Is(err, repocache.ErrNoRef):
		return "", false, errNoCommit
	case err != nil:
		w.cold(base, err)
		return "", false, nil
	}
	base.Cache = CacheMiss
	if hit {
		base.Cache = CacheHit
	}
	return sha, true, nil
}

// cold records that the cache could not serve a checkout, which goes on
// without it: a job never fails for its cache (a full disk, say).
func (w *Workspaces) cold(base *Base, err error) {
	base.Cache, base.CacheCold = CacheCold, err.Error()
	w.log.Warn().Err(err).Str("tenant", base.Spec.Tenant).Str("id", base.Spec.ID).
		Msg("the repository cache could not serve this checkout; fetching from the remote")
}
