// Package envcache keeps the results of setup scripts (docs/warm.md): the job
// field setup is a shell script run in the checkout before the agent
// starts (npm ci, a build); the files it leaves there are saved under a
// key and put back for later jobs instead of running it again.
//
// # The key
//
// [Key] hashes the repository URL, the script, and the contents of the
// files the script names as its inputs with lines like
//
//	# inputs: package-lock.json tools/versions.txt
//
// ([ParseInputs]; paths relative to the checkout, no "..", missing files
// count as missing). The same script on the same lock file restores; a
// changed lock file runs the script again.
//
// # What is saved
//
// The files the setup left in the checkout: new, modified, untracked and
// ignored ones. [TakeSnapshot] before and after the setup (git status
// --porcelain -z --ignored --untracked-files=all, run hardened inside the
// sandbox since the setup may have rewritten .git/config, with each
// file's size and modification time) and [Changed] give them; a caller
// that knows them may pass its own list. Regular files, symbolic links and empty
// directories are kept with their modes; files the setup deleted are not
// recorded.
//
// # Restoring
//
// [Cache.Restore] copies the files back into the checkout, copy-on-write
// where the filesystem allows (the FICLONE ioctl: reflinks on XFS, Btrfs
// and others), else a plain copy. Never hard links: the agent could write
// through one into the cache. Writes go through an [os.Root] of the
// checkout, so a symbolic link in the repository cannot send them
// elsewhere.
//
// # Prepared restores
//
// Copying is bounded by creating files (100–250 µs of CPU each on ext4
// without reflinks), so a cache that only copies restores hundreds of
// files no faster than a few hundred milliseconds. Between jobs, after an
// entry is saved or restored, the cache therefore prepares a complete
// copy of the entry's files laid out as they go into a checkout
// (<Dir>/spares/<key>/<random>, built by the same code a copying restore
// runs, under a temporary name, renamed into place when complete, with
// the entry's manifest); Config.Spares per key (DefaultSpares, NoSpares
// for none), counted against Config.MaxBytes (a copy that does not fit is
// not made; eviction drops prepared copies before entries).
//
// A restore first claims one (a rename out of the spares directory, so
// two restores never get the same one), checks it against the manifest
// (every path and no other, each file's size and mode, each link's
// target: anything missing, extra, truncated or changed and it is dropped
// and reported as an [Event], never served) and moves it into the
// checkout by rename(2) of the highest paths the checkout lacks,
// descending into directories both have (a setup that wrote src/gen/x.go
// into a checkout with src/ renames src/gen). Every step goes through
// directory descriptors opened without following links: a symbolic link
// of the checkout where the copy has a directory stops the move. Then the
// cache prepares the next. With no copy ready, on another filesystem, or
// on any error the restore copies as before (which also completes a move
// that stopped half way); [Result].Prepared says which it was.
//
// The preparation runs in the background between [Cache.Start] and
// [Cache.Stop] (the worker calls both). What a worker killed while
// preparing or moving leaves is removed by the next [Open] of the
// directory that finds no other Cache holding it open.
//
// # Integrity and bounds
//
// An entry is written in a directory of its own and renamed into place
// once complete, with a sealed manifest (every file's size, a last line
// with the count and total). An entry whose files do not match its
// manifest (truncated, half-written, tampered) is dropped and reported as
// [ErrCorrupt], never served; the caller runs the setup and saves anew.
// The entries' total size is bounded (Config.MaxBytes); the least
// recently used go first. A Save that cannot complete (a full disk, an
// entry larger than the bound) returns an error the caller logs: the job
// ran its setup cold and says so; nothing fails for the cache.
//
// # Running the setup
//
// [RunSetup] runs the script in a sandbox (sh -e -c, in the checkout,
// stderr merged into stdout in the order written), hands every output
// line to a callback (the worker publishes each on
// <prefix>.query.<tenant>.<id>.setup) and returns a [*SetupError] naming
// the exit status when the script fails (the run ends failed, error.code
// setup).
package envcache
