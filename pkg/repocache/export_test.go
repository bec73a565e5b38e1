package repocache

import "context"

// OnBuild makes c call f as each tree starts being built, in the
// preparation's goroutine (with its context).
func OnBuild(c *Cache, f func(ctx context.Context, tmp string)) { c.onBuild = f }

// PrepareNow prepares trees of repo at commit in the caller's goroutine.
func PrepareNow(ctx context.Context, c *Cache, repo, commit string) (int, error) {
	return c.prepare(ctx, repo, commit)
}

// Sizes is what eviction counts: each mirror's and each tree's bytes, by
// path.
func Sizes(c *Cache) map[string]int64 {
	all, _ := c.evictable()
	out := map[string]int64{}
	for _, e := range all {
		if e.tree != "" {
			out[e.tree] = e.size
		} else {
			out[e.m.dir] = e.size
		}
	}
	return out
}

// Scratch makes a scratch directory as a live owner would, and returns
// its release.
func Scratch(parent, prefix string) (string, func(), error) { return scratch(parent, prefix) }
