package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/envcache"
	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// maxRepoCacheTrees bounds --repo-cache-trees: each tree is a whole
// checkout on disk.
const maxRepoCacheTrees = 16

// checkCacheFlags refuses cache settings that cannot work (validate).
func checkCacheFlags(o *options) error {
	if o.repoCacheTrees < 0 || o.repoCacheTrees > maxRepoCacheTrees {
		return fmt.Errorf("--repo-cache-trees must be between 0 and %d, not %d", maxRepoCacheTrees, o.repoCacheTrees)
	}
	return nil
}

// openCaches opens --repo-cache (docs/warm.md): the repositories' mirrors and
// prepared trees (--repo-cache-trees) in DIR and the setup environments in
// DIR/envs. Both nil without it. The repository cache is started: it
// prepares trees in the background until stopRepoCache.
func openCaches(ctx context.Context, o *options, log zerolog.Logger) (*repocache.Cache, *envcache.Cache, error) {
	if o.repoCache == "" {
		return nil, nil, nil
	}
	cfg := repocache.Config{Dir: o.repoCache, AllowFile: o.wsAllowFile, Trees: o.repoCacheTrees, Logger: &log}
	if o.contain.isolation == sandbox.IsolationContained {
		// Trees are made the agent's, as its checkouts are.
		cfg.TreeOwner = o.contain.agentUID
	}
	repos, err := repocache.Open(cfg)
	if err != nil {
		return nil, nil, failed(2, "--repo-cache", err)
	}
	spares := o.envSpares
	if spares == 0 {
		spares = envcache.NoSpares
	}
	envs, err := envcache.Open(envcache.Config{Dir: filepath.Join(o.repoCache, "envs"), Spares: spares})
	if err != nil {
		return nil, nil, failed(2, "--repo-cache", err)
	}
	if err := repos.Start(ctx); err != nil {
		return nil, nil, failed(1, "--repo-cache", err)
	}
	return repos, envs, nil
}

// stopRepoCache stops the repository cache's background work (a tree
// being prepared is cancelled and removed), after the worker stopped: no
// job asks for a tree any more. nil is no cache.
func stopRepoCache(repos *repocache.Cache, log zerolog.Logger) {
	if repos == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := repos.Stop(ctx); err != nil {
		log.Warn().Err(err).Msg("repository cache: stopping the preparation of trees")
	}
}
