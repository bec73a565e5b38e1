// Package sandbox runs agent processes in isolated places and moves files in
// and out of them. One contract, several providers: Local (a child process
// on this machine) and Cloudflare (a Cloudflare Sandbox reached through our
// bridge Worker).
//
// # Contract
//
// A Provider creates a Sandbox named by Spec.ID ([A-Za-z0-9_-], at most 128
// bytes). A Sandbox starts processes and reads and writes files relative to
// its workspace; Destroy stops every process and removes the sandbox. A
// Process streams its stdout, keeps the tail of its stderr, and ends with an
// ExitStatus.
//
//	sb, err := provider.Create(ctx, sandbox.Spec{ID: "job-42"})
//	err = sb.WriteFile(ctx, "prompt.txt", prompt)
//	p, err := sb.Start(ctx, sandbox.ProcSpec{ID: "attempt-1", Argv: argv, Stdin: prompt})
//	// read p.Stdout() to EOF, then:
//	st, err := p.Wait(ctx)          // st.Code, st.Signal, st.StderrTail
//	err = sb.Destroy(ctx)
//
// Argv is executed directly, never through a shell; Argv[0] is looked up in
// the child's PATH. ProcSpec.Stdin is written to the process's stdin, which is
// then closed (a child that never reads it is fine). The package
// sandboxtest holds the suite every provider passes; read it as the
// executable form of this contract.
//
// # Ordering
//
// Stdout arrives in the order the process wrote it, as it is written, and
// ends with io.EOF. Stderr is a separate stream: it is drained all the time
// (a process writing megabytes of stderr before any stdout never blocks),
// optionally copied to ProcSpec.Stderr, and its last StderrTailBytes (8 KiB
// by default) are kept for ExitStatus.StderrTail. There is no ordering
// between stdout and stderr. Stdout is not buffered without bound: a caller
// that stops reading it stalls the process, so read it to EOF (from its own
// goroutine if the caller also waits on something else).
//
// # Stopping and failure
//
// Callers own cancellation and timeouts: they call Process.Stop(ctx, grace),
// which sends SIGTERM to the whole process group, waits up to grace for the
// process to exit, then sends SIGKILL; Stop on a process that already exited
// returns ErrExited. Wait returns once the process has exited, even if a
// descendant still holds its output open; its error is only for a status that
// could not be learnt (ctx done, or ErrUnavailable from a remote provider).
// A process killed by a signal has Code -1 and Signal set ("SIGKILL") when
// the provider can tell (Local always can).
//
// Errors wrap the sentinels, compared with errors.Is: ErrInvalid for a bad
// request (bad ID, empty Argv, a path outside the workspace), ErrNotFound for
// a missing file, ErrClosed after Destroy, ErrExited from Stop, and
// ErrUnavailable for a provider that could not be reached (Retryable). A
// program that cannot be started at all is a *SpawnError (also ErrInvalid),
// so the agent runner can report "spawn_failed".
//
// # Secrets and environment
//
// A process's environment is built, never inherited: the provider starts
// from nothing, adds what its configuration allows, then Spec.Env, then
// ProcSpec.Env (later wins). The deny-list (DeniedEnv) is applied last and
// wins over everything: CLAUDECODE and every FLEET_*, NATS_*, AWS_*, R2_*,
// CLOUDFLARE_* and CF_* variable are dropped, so the worker's NATS
// credentials, storage keys and bridge token cannot reach an agent even if a
// caller puts them in Spec.Env by mistake. Dropped names (never values) are
// logged. Nothing in this package logs argv, stdin, output or environment
// values.
//
// # Local
//
// Local gives each sandbox a directory Root/<id> with work/ (the workspace
// and default working directory), home/ (HOME), home/.claude
// (CLAUDE_CONFIG_DIR) and tmp/ (TMPDIR); those three variables always point
// there whatever Env says. The environment is the base allow-list (PATH,
// LANG, LC_ALL, LC_CTYPE, TZ, TERM, USER, LOGNAME) plus LocalConfig.EnvAllow
// copied from the worker's environment, then LocalConfig.Env, Spec.Env and
// ProcSpec.Env, then the deny-list. ANTHROPIC_API_KEY reaches the agent only
// if the operator lists it in EnvAllow.
//
// Each process is a child in its own process group, with Pdeathsig SIGKILL on
// Linux so it dies with the worker. Stop and Destroy signal the whole group.
// WriteFile and ReadFile go through os.Root, so absolute paths, ".." and
// symlinks leading out of the workspace give ErrInvalid. Destroy also removes
// read-only trees an agent left behind.
//
// Directories come from a pool (localpool.go): once every process of a
// destroyed sandbox has ended, a tree nothing wrote to (exactly the four
// empty 0700 directories, no symlink) is renamed into Root/.pool and the
// next Create takes it with one rename instead of five mkdirs; any other
// tree is renamed into Root/.trash and removed, one Destroy at a time
// emptying the trash in passes, with whatever others renamed there
// meanwhile. Nothing a run wrote ever reaches another sandbox.
//
// # Local: no process outlives its run
//
// When a process's leader exits (by itself, by Stop on cancel, timeout or
// hand-back, or by Destroy), every process it started is killed, however it
// detached: the rest of its process group, and also what left the group.
// Claude Code's Bash tool runs its shell in a session of its own (setsid), so
// a process-group kill alone never reaches a `sleep 300` it runs; a double
// fork leaves a process with PPID 1. Wait returns, and stdout ends, only once
// they are all gone. How Local finds them is LocalConfig.Containment:
//
//   - cgroup (the default where possible): each process starts inside a cgroup
//     v2 group of its own (clone3 CLONE_INTO_CGROUP, so not even its first
//     fork happens outside), a child of the worker's own group named
//     agentfleet-<worker pid>/<n>. Every descendant inherits it and cannot
//     leave it without privileges; the run ends with cgroup.kill (Linux
//     5.14+; before that, SIGKILL to each member until the group is empty)
//     and the group is removed. A group the run left empty (nothing to kill)
//     is kept instead, with its open directory, for a later run: making and
//     removing a group costs the kernel about 80 µs, reading it empty 10.
//     Kept groups and the base go after ten seconds without a run, or when
//     the worker stops (Local.Close). A worker that died with
//     SIGKILL leaves its runs' groups behind: the next Local in a process on
//     the same machine kills and removes the groups of dead workers. This needs
//     a writable cgroup v2 hierarchy: root on a host or VM (also the hybrid
//     layout, /sys/fs/cgroup/unified), a systemd unit with Delegate=yes, or a
//     container given its own writable cgroup.
//   - environ (the fallback, e.g. in an unprivileged container whose
//     /sys/fs/cgroup is read-only): each process gets AGENTFLEET_RUN=<random
//     token> in its environment, which every descendant inherits; the run ends
//     by scanning /proc for processes whose environment holds the token and
//     killing them (through a pidfd, so a recycled pid is never hit), pass
//     after pass until none is left. A descendant that clears its environment
//     and leaves the process group escapes it; Claude Code and the shells and
//     tools it runs keep their environment. The agent can read the token; it
//     is no secret and grants nothing.
//   - group: only the process group (the behaviour where /proc does not exist).
//
// "auto" picks cgroup when the worker can create a group and move a process
// into it, else environ, and logs why. A PID namespace (the agent as PID 1 of
// its own namespace, killing everything in it when it exits) was not chosen:
// it needs CAP_SYS_ADMIN just as cgroups do, and changes the agent's signal
// semantics (PID 1 ignores a SIGTERM it has no handler for). Making the
// worker a child subreaper was not chosen either: orphans would become the
// worker's children, which it must then reap without stealing os/exec's
// exit statuses, and it still could not tell which run an orphan came from.
//
// With IsolationNone (LocalConfig's default) Local isolates environment,
// directories and process lifetime; it is not a security boundary:
// processes run as the worker's user and can read what that user can.
// IsolationContained runs each process in namespaces through bubblewrap, as
// an unprivileged uid seeing only its sandbox's directories, private /tmp
// and /var/tmp, and the system's read-only ones (never LocalConfig.HiddenPaths).
// The worker command uses it unless its operator sets none explicitly.
package sandbox
