// Package repocache keeps a bare mirror of each repository the worker's
// workspaces check out (docs/warm.md), so that a checkout after the first
// fetches only what is new and borrows every object it already has.
//
// # Layout
//
// Under Config.Dir each repository URL has a directory named by the hash
// of the URL: mirrors/<key>.git, a bare repository of the fleet's own, with
// a lock file beside it (<key>.lock). A mirror holds only packs (fetches
// keep what they receive as a pack), and a file, fleet-complete, that lists
// every pack with its size once a fetch has finished. A mirror whose packs
// do not match that list (a fetch that died half-way, a truncated file) is
// corrupt: it is dropped and fetched again, never served.
//
// # Credentials
//
// The cache serves a repository to a job only after the job's own
// credentials were accepted by the remote for it: [LsRemote] asks the
// remote first (it also resolves the ref), and only then does [Cache.Link]
// hand out the mirror's objects. The mirror is fetched with the same
// credentials, handed to the one git process through its environment
// (GIT_CONFIG_COUNT), never written to its config.
//
// # Borrowing objects
//
// [Cache.Link] hard-links the mirror's packs into a checkout's
// .git/objects/pack (copying them where the checkout is on another
// filesystem): the checkout then has every object it needs and depends on
// nothing of the cache afterwards, so a later fetch, repack or eviction of
// the mirror cannot break a job that is running. Packs are immutable once
// written; a contained agent (docs/contained.md) runs as another uid and cannot write
// them.
//
// # Prepared working trees
//
// Writing a large repository's files is most of a checkout once the
// objects are local. With Config.Trees > 0 and the cache running
// ([Cache.Start] to [Cache.Stop], one goroutine of its own), [Cache.Prepare]
// (called once a job of repository R was served commit C) makes, in the
// background, Config.Trees complete checkouts of R at C under
// trees/<key>/: git init, the mirror's packs borrowed as Link borrows them,
// origin the repository URL, no credentials, every git command run on
// this machine with the hardening flags. Each is built under a temporary
// name (.tmp-*, whose owner holds a flock of <name>.lock) and renamed to
// <C>.<random>.tree once complete, with a seal (fleet-tree: the commit and
// the tree's size). Preparing another commit of R removes R's trees of the
// commit before. With Config.TreeOwner (a contained agent's uid) a tree is
// given to that uid as it is made, but its packs, and its index refreshed:
// the job that takes it has nothing to chown, and git nothing to read
// again. A preparation that fails (a full disk) is logged, and nothing
// else changes.
//
// [Cache.TakeTree] hands one to a job, after its own credentials passed
// the remote ([LsRemote]): the tree is renamed out of trees/ (to taken/,
// the claim: two jobs never get one tree), then its entries are renamed
// into the job's empty working directory, which stays the directory it
// is. A directory on another filesystem gets none (a tree is moved, never
// copied). The caller verifies what it got (package workspace: git status
// must be clean) and drops it otherwise. Opening the cache removes the
// temporary and half-taken trees whose owner is gone (a worker that died);
// stopping it cancels a preparation under way and removes what it made.
//
// # Concurrency and bounds
//
// A mirror is fetched under an exclusive flock of its lock file and read
// (linked) under a shared one, so jobs on one repository and workers
// sharing the directory across restarts never see a half-fetched mirror.
// When the mirrors' and trees' total size passes Config.MaxBytes, the least
// recently used mirrors that no one holds, and trees, are removed (a
// mirror's trees with it). A tree counts its files but not its packs,
// which are the mirror's (hard links).
//
// A cache that cannot do its work (a full disk, a failed fetch into the
// mirror) is an error the caller answers by checking out without the
// cache: a job never fails for its cache.
package repocache
