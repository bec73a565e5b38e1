// Package procscrub hides a process's secrets from the other processes of
// its machine, which the worker's agents are (docs/protocol.md: the worker's
// secrets never reach a sandboxed agent).
//
// The local sandbox builds each agent's environment from an allow-list, so
// no secret is in the agent's own environment or argv. But the agent runs
// as the worker's user, and the worker's own /proc/<pid>/environ and
// /proc/<pid>/cmdline show the environment and arguments the worker was
// started with: FLEET_CF_BRIDGE_TOKEN, AWS_SECRET_ACCESS_KEY, a password in
// --nats-url. Go copies the environment into its own memory before main
// runs (and os.Args, once Scrub has copied it) and never reads the
// original block again, so Scrub overwrites the secret parts of that block
// in place (through /proc/self/mem, at the addresses
// /proc/self/stat gives): the process keeps working from its copies, and
// /proc shows "****" where the secrets were. It then marks the process
// non-dumpable (PR_SET_DUMPABLE 0), so a process of the same user that is
// not root can no longer read its memory, environ or file descriptors, or
// attach a debugger.
//
// What it cannot hide: a root agent can still read the worker's memory,
// and any agent can read files the worker's user can read (a
// --git-credentials or --nats-creds file). Run untrusted agents under the
// Cloudflare provider, or as another user (docs/agents.md, "Secrets").
package procscrub
