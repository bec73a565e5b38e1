// Package workspace gives an agent a real git repository to work in and
// brings back everything it changed (docs/workspaces.md).
//
// Checkout and Capture run git inside the sandbox through sandbox.Sandbox
// (Start, ReadFile, WriteFile), so one implementation serves every
// provider: Local runs git on the worker's machine in the sandbox
// directory, Cloudflare runs it in the container through the bridge's
// generic exec route. Git must be installed where the sandbox runs.
//
//	ws, _ := workspace.New(workspace.Config{Store: store, Credentials: creds})
//	base, err := ws.Checkout(ctx, sb, workspace.Spec{Tenant: t, ID: id, Workspace: *job.Workspace})
//	// run the agent in the sandbox's workspace root (the repository root)
//	art, err := ws.Capture(ctx, sb, base)
//
// # Checkout
//
// git init, a remote "origin" (the plain URL), one fetch of the ref
// (branch, tag, full commit id, or the remote's HEAD) at the job's depth
// (50 by default, 0 = full history), and a checkout of a new branch (the
// job's, fleet/<tenant>/<id> by default) at the fetched commit, start_sha.
// A missing repository or ref, refused credentials, a file:// remote on a
// worker without AllowFile, or a repository over MaxBytes is a
// *CheckoutError wrapping ErrCheckout: fail the job, do not retry. Anything
// else wraps ErrTransient.
//
// # Capture
//
// git add -A (so .gitignore applies), one commit by the fleet identity
// (CommitName, CommitEmail) when anything is uncommitted, the work branch
// moved to HEAD (end_sha), then the manifest (git diff -z -M --numstat and
// --name-status start_sha end_sha), the diff (git diff --binary start_sha
// end_sha, which git apply applies to start_sha) and the bundle (git bundle
// create of the branch with ^start_sha, so start_sha is its prerequisite),
// both streamed into the Store under queries/<tenant>/<id>/workspace/. A
// run that changed nothing has an empty diff and no bundle, and so does one
// whose branch only moved back to an ancestor of start_sha (git refuses an
// empty bundle). The push
// happens last, so a rejected push (Artifact.PushError) loses nothing.
//
// # Restore
//
// Restore continues an earlier run of the same query (a parked session
// that resumes) in a fresh checkout: the stored bundle is fetched and the
// work branch set to its tip, keeping the earlier start_sha, so the next
// Capture covers every run.
//
// # Credentials
//
// The worker's Credentials (git's credential-store format) are turned into
// one http.<url>.extraHeader entry for the matching host and given to the
// fetch or push process only, over its stdin: a small sh wrapper reads it
// into GIT_CONFIG_VALUE_0 of the git it execs. They are never in the
// agent's environment, argv or files, in .git/config or the remote URL, and
// git is never run with them while the agent runs. The repository the
// agent worked in is not trusted: every git command runs with hooks,
// fsmonitor, external diff drivers and the sandbox's credential helpers and
// prompts off, and the push goes out of a fresh bare repository of the
// fleet's (.git/fleet-push-<random>, objects borrowed through alternates), so no
// config the agent wrote (http.proxy, url.*.insteadOf, include.path) sees
// the credential.
//
// Limits: ssh remotes work only with keys the sandbox already has (the
// worker hands no ssh keys to sandboxes); a commit ref must be the full id.
package workspace
