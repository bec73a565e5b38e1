package main

import (
	"path/filepath"

	"github.com/agentfleet/agentfleet/pkg/envcache"
	"github.com/agentfleet/agentfleet/pkg/repocache"
)

// openCaches opens --repo-cache (SPEC 15): the repositories' mirrors in
// DIR and the setup environments in DIR/envs. Both nil without it.
func openCaches(o *options) (*repocache.Cache, *envcache.Cache, error) {
	if o.repoCache == "" {
		return nil, nil, nil
	}
	repos, err := repocache.Open(repocache.Config{Dir: o.repoCache, AllowFile: o.wsAllowFile})
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
	return repos, envs, nil
}
