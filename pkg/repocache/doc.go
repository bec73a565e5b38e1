// Package repocache keeps a bare mirror of each repository the worker's
// workspaces check out (SPEC 15), so that a checkout after the first
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
// written; a contained agent (SPEC 14) runs as another uid and cannot write
// them.
//
// # Concurrency and bounds
//
// A mirror is fetched under an exclusive flock of its lock file and read
// (linked) under a shared one, so jobs on one repository and workers
// sharing the directory across restarts never see a half-fetched mirror.
// When the mirrors' total size passes Config.MaxBytes, the least recently
// used mirrors that no one holds are removed.
//
// A cache that cannot do its work (a full disk, a failed fetch into the
// mirror) is an error the caller answers by checking out without the
// cache: a job never fails for its cache.
package repocache
