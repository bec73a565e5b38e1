package sandbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
)

// guard bounds waits so a broken implementation fails instead of hanging.
const guard = 2 * time.Minute

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	t.Cleanup(cancel)
	return ctx
}

type localBundle struct {
	root  string // LocalConfig.Root, symlinks resolved
	local *sandbox.Local
}

// setupLocal returns a Local rooted in a fresh temporary directory; cfg.Root
// and cfg.Logger are filled in.
func setupLocal(t *testing.T, cfg sandbox.LocalConfig) *localBundle {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	cfg.Root = root
	logger := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	cfg.Logger = &logger
	l, err := sandbox.NewLocal(cfg)
	require.NoError(t, err)
	return &localBundle{root: root, local: l}
}

// create creates a sandbox destroyed at the end of the test.
func (b *localBundle) create(t *testing.T, id string, env map[string]string) sandbox.Sandbox {
	t.Helper()
	sb, err := b.local.Create(testCtx(t), sandbox.Spec{ID: id, Env: env})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		require.NoError(t, sb.Destroy(ctx))
	})
	return sb
}

// run runs the sandboxtest child steps to completion.
func run(t *testing.T, sb sandbox.Sandbox, spec sandbox.ProcSpec, steps ...string) (string, sandbox.ExitStatus) {
	t.Helper()
	if spec.ID == "" {
		spec.ID = "p-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	if spec.Argv == nil {
		spec.Argv = sandboxtest.ChildArgv(steps...)
	}
	p, err := sb.Start(testCtx(t), spec)
	require.NoError(t, err)
	out, err := io.ReadAll(p.Stdout())
	require.NoError(t, err)
	st, err := p.Wait(testCtx(t))
	require.NoError(t, err)
	return string(out), st
}

func childEnv(t *testing.T, sb sandbox.Sandbox, spec sandbox.ProcSpec) map[string]string {
	t.Helper()
	out, st := run(t, sb, spec, "env")
	require.Equal(t, 0, st.Code, "stderr: %s", st.StderrTail)
	var env map[string]string
	require.NoError(t, json.Unmarshal([]byte(out), &env))
	return env
}

func TestLocal(t *testing.T) {
	sandboxtest.Exercise(t, func(t *testing.T) sandbox.Provider {
		return setupLocal(t, sandbox.LocalConfig{}).local
	}, sandboxtest.Features{SignalsReported: true, LocalPIDs: true, SpawnErrors: true, Interactive: true})
}

func TestNewLocalValidates(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for name, cfg := range map[string]sandbox.LocalConfig{
		"no root":             {},
		"negative KillGrace":  {Root: root, KillGrace: -time.Second},
		"negative WaitDelay":  {Root: root, WaitDelay: -time.Second},
		"EnvAllow bad name":   {Root: root, EnvAllow: []string{"A=B"}},
		"EnvAllow empty name": {Root: root, EnvAllow: []string{""}},
		"EnvAllow secret":     {Root: root, EnvAllow: []string{"AWS_SECRET_ACCESS_KEY"}},
		"EnvAllow bridge":     {Root: root, EnvAllow: []string{"FLEET_CF_BRIDGE_TOKEN"}},
		"Env secret":          {Root: root, Env: map[string]string{"NATS_TOKEN": "x"}},
		"Env NUL value":       {Root: root, Env: map[string]string{"X": "a\x00b"}},
	} {
		_, err := sandbox.NewLocal(cfg)
		require.ErrorIs(t, err, sandbox.ErrInvalid, name)
	}
	l, err := sandbox.NewLocal(sandbox.LocalConfig{Root: filepath.Join(root, "created", "on", "demand")})
	require.NoError(t, err)
	require.Equal(t, "local", l.Name())
	require.DirExists(t, filepath.Join(root, "created", "on", "demand"))
}

func TestLocalCreateValidatesID(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	for _, id := range []string{"", "a/b", "..", "a b", "ü", strings.Repeat("x", 129)} {
		_, err := b.local.Create(testCtx(t), sandbox.Spec{ID: id})
		require.ErrorIs(t, err, sandbox.ErrInvalid, "ID %q", id)
	}
	_, err := b.local.Create(testCtx(t), sandbox.Spec{ID: "ok", Env: map[string]string{"A=B": "x"}})
	require.ErrorIs(t, err, sandbox.ErrInvalid, "bad Spec.Env name")
	b.create(t, strings.Repeat("x", 128), nil)
	b.create(t, "Az09_-", nil)
}

func TestLocalLayoutAndEnvPaths(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	sb := b.create(t, "layout", nil)
	dir := filepath.Join(b.root, "layout")
	for _, d := range []string{"work", "home", "home/.claude", "tmp"} {
		require.DirExists(t, filepath.Join(dir, d))
	}
	env := childEnv(t, sb, sandbox.ProcSpec{Env: map[string]string{
		"HOME": "/root", "CLAUDE_CONFIG_DIR": "/root/.claude", "TMPDIR": "/tmp", // cannot move them out
	}})
	require.Equal(t, filepath.Join(dir, "home"), env["HOME"])
	require.Equal(t, filepath.Join(dir, "home", ".claude"), env["CLAUDE_CONFIG_DIR"])
	require.Equal(t, filepath.Join(dir, "tmp"), env["TMPDIR"])
	require.Equal(t, filepath.Join(dir, "work"), env["PWD"])

	out, _ := run(t, sb, sandbox.ProcSpec{}, "pwd")
	require.Equal(t, filepath.Join(dir, "work")+"\n", out)
}

// TestLocalEnvAllowList sets process environment variables, so it is not parallel.
func TestLocalEnvAllowList(t *testing.T) {
	t.Setenv("SANDBOXTEST_ALLOWED", "allowed-value")
	t.Setenv("SANDBOXTEST_NOT_ALLOWED", "hidden-value")
	t.Setenv("ANTHROPIC_API_KEY", "sk-test-key")
	t.Setenv("LANG", "C.UTF-8")

	b := setupLocal(t, sandbox.LocalConfig{
		EnvAllow: []string{"SANDBOXTEST_ALLOWED", "SANDBOXTEST_UNSET"},
		Env:      map[string]string{"SANDBOXTEST_FIXED": "fixed", "SANDBOXTEST_OVERRIDDEN": "operator"},
	})
	sb := b.create(t, "allow", map[string]string{"SANDBOXTEST_OVERRIDDEN": "spec"})
	env := childEnv(t, sb, sandbox.ProcSpec{})
	require.Equal(t, "allowed-value", env["SANDBOXTEST_ALLOWED"], "EnvAllow copies from the worker")
	require.Equal(t, "fixed", env["SANDBOXTEST_FIXED"], "LocalConfig.Env")
	require.Equal(t, "spec", env["SANDBOXTEST_OVERRIDDEN"], "Spec.Env overrides LocalConfig.Env")
	require.Equal(t, os.Getenv("PATH"), env["PATH"], "PATH is on the base allow-list")
	require.Equal(t, "C.UTF-8", env["LANG"], "LANG is on the base allow-list")
	require.NotContains(t, env, "SANDBOXTEST_NOT_ALLOWED")
	require.NotContains(t, env, "SANDBOXTEST_UNSET", "an allowed but unset variable stays unset")
	require.NotContains(t, env, "ANTHROPIC_API_KEY", "the API key passes only when allow-listed")

	// Nothing beyond the allow-lists, the sandbox paths and the given Env.
	known := []string{"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "USER", "LOGNAME",
		"HOME", "CLAUDE_CONFIG_DIR", "TMPDIR", "PWD",
		"SANDBOXTEST_ALLOWED", "SANDBOXTEST_FIXED", "SANDBOXTEST_OVERRIDDEN"}
	for name := range env {
		require.Contains(t, known, name, "unexpected variable in the child")
	}

	// The worker's model credential is its gateway's (docs/gateway.md): never
	// copied, even allow-listed; a process spec may set the run's token.
	b2 := setupLocal(t, sandbox.LocalConfig{EnvAllow: []string{"ANTHROPIC_API_KEY", "SANDBOXTEST_ALLOWED"}})
	env = childEnv(t, b2.create(t, "key", nil), sandbox.ProcSpec{})
	require.NotContains(t, env, "ANTHROPIC_API_KEY", "the worker's model key never reaches a sandbox")
	require.Equal(t, "allowed-value", env["SANDBOXTEST_ALLOWED"], "other allow-listed names still pass")
	env = childEnv(t, b2.create(t, "token", nil), sandbox.ProcSpec{Env: map[string]string{"ANTHROPIC_API_KEY": "fleet-run-token"}})
	require.Equal(t, "fleet-run-token", env["ANTHROPIC_API_KEY"], "the run's token, set by the worker, passes")
}

func TestLocalDenyListWinsOverSpecEnv(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	spec := map[string]string{"fleet_nats_creds": "x", "Aws_Session_Token": "x", "R2_SECRET": "x", "KEEP": "spec"}
	sb := b.create(t, "deny", spec)
	env := childEnv(t, sb, sandbox.ProcSpec{Env: map[string]string{
		"CF_API_TOKEN": "x", "NATS_URL": "nats://secret", "CLAUDECODE": "1", "KEEP_TOO": "proc",
	}})
	for _, name := range []string{"fleet_nats_creds", "Aws_Session_Token", "R2_SECRET", "CF_API_TOKEN", "NATS_URL", "CLAUDECODE"} {
		require.NotContains(t, env, name)
	}
	require.Equal(t, "spec", env["KEEP"])
	require.Equal(t, "proc", env["KEEP_TOO"])
}

func TestDeniedEnv(t *testing.T) {
	t.Parallel()
	for name, denied := range map[string]bool{
		"FLEET_NATS_CREDS": true, "FLEET_CF_BRIDGE_TOKEN": true, "fleet_storage": true,
		"AWS_SECRET_ACCESS_KEY": true, "AWS_ACCESS_KEY_ID": true, "NATS_PASSWORD": true,
		"CLOUDFLARE_API_TOKEN": true, "CF_ACCOUNT_ID": true, "R2_ACCESS_KEY": true,
		"CLAUDECODE": true, "claudecode": true,
		"ANTHROPIC_API_KEY": false, "CLAUDE_CONFIG_DIR": false, "HOME": false, "PATH": false,
		"MY_FLEET_X": false, "CLAUDECODE_X": false, "AWSX": false,
	} {
		require.Equal(t, denied, sandbox.DeniedEnv(name), name)
	}
}

func TestLocalSymlinkEscape(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	sb := b.create(t, "links", nil)
	work := filepath.Join(b.root, "links", "work")
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("outside"), 0o600))
	require.NoError(t, os.Symlink(outside, filepath.Join(work, "out")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(work, "abs")))
	require.NoError(t, os.Symlink("../../..", filepath.Join(work, "up")))
	require.NoError(t, os.Mkdir(filepath.Join(work, "real"), 0o755))
	require.NoError(t, os.Symlink("real", filepath.Join(work, "inside")))
	ctx := testCtx(t)

	for _, p := range []string{"out/secret", "abs", "up/x", "out/new"} {
		_, err := sb.ReadFile(ctx, p)
		require.ErrorIs(t, err, sandbox.ErrInvalid, "ReadFile(%q)", p)
		require.ErrorIs(t, sb.WriteFile(ctx, p, []byte("x")), sandbox.ErrInvalid, "WriteFile(%q)", p)
	}
	require.ErrorIs(t, sb.WriteFile(ctx, "out/deeper/new", []byte("x")), sandbox.ErrInvalid)
	got, err := os.ReadFile(filepath.Join(outside, "secret"))
	require.NoError(t, err)
	require.Equal(t, "outside", string(got), "the file outside was not overwritten")
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Len(t, entries, 1, "nothing was created outside")

	_, err = sb.Start(ctx, sandbox.ProcSpec{ID: "p", Argv: sandboxtest.ChildArgv("pwd"), Dir: "out"})
	require.ErrorIs(t, err, sandbox.ErrInvalid, "Dir through a symlink out of the workspace")

	// A symlink that stays inside the workspace is fine.
	require.NoError(t, sb.WriteFile(ctx, "inside/f", []byte("in")))
	got, err = sb.ReadFile(ctx, "real/f")
	require.NoError(t, err)
	require.Equal(t, "in", string(got))
	out, st := run(t, sb, sandbox.ProcSpec{Dir: "inside"}, "print-file f")
	require.Equal(t, 0, st.Code)
	require.Equal(t, "in", out)
}

func TestLocalDestroyRemovesDirectory(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	sb := b.create(t, "gone", nil)
	ctx := testCtx(t)
	dir := filepath.Join(b.root, "gone")
	require.NoError(t, sb.WriteFile(ctx, "ro/file", []byte("x")))
	// A read-only directory tree, like Go's module cache, must not stop Destroy.
	require.NoError(t, os.Chmod(filepath.Join(dir, "work", "ro"), 0o500))
	outside := t.TempDir()
	require.NoError(t, os.Chmod(outside, 0o555))
	t.Cleanup(func() { _ = os.Chmod(outside, 0o755) })
	require.NoError(t, os.WriteFile(filepath.Join(outside, "keep"), []byte("k"), 0o400))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "work", "link")))

	require.NoError(t, sb.Destroy(ctx))
	require.NoDirExists(t, dir)
	require.FileExists(t, filepath.Join(outside, "keep"), "Destroy does not follow symlinks")
	fi, err := os.Stat(outside)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o555), fi.Mode().Perm(), "Destroy did not chmod through the symlink")

	require.ErrorIs(t, sb.WriteFile(ctx, "f", nil), sandbox.ErrClosed)
	_, err = sb.ReadFile(ctx, "f")
	require.ErrorIs(t, err, sandbox.ErrClosed)

	// The same ID can be created again, from scratch.
	sb2 := b.create(t, "gone", nil)
	_, err = sb2.ReadFile(ctx, "ro/file")
	require.ErrorIs(t, err, sandbox.ErrNotFound)
}

func TestLocalCreateReturnsOpenSandbox(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	sb := b.create(t, "same", map[string]string{"V": "1"})
	ctx := testCtx(t)
	again, err := b.local.Create(ctx, sandbox.Spec{ID: "same", Env: map[string]string{"V": "2"}})
	require.NoError(t, err)
	require.Same(t, sb, again)
	require.Equal(t, "2", childEnv(t, sb, sandbox.ProcSpec{})["V"], "the new Spec.Env applies to later processes")
}

func TestLocalSpawnFailure(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	sb := b.create(t, "spawn", nil)
	ctx := testCtx(t)
	require.NoError(t, sb.WriteFile(ctx, "not-executable", []byte("#!/bin/sh\n")))
	require.NoError(t, sb.WriteFile(ctx, "adir/x", nil))
	for _, argv0 := range []string{"./not-executable", "adir", "./adir", "no-such-program-anywhere"} {
		_, err := sb.Start(ctx, sandbox.ProcSpec{ID: "p", Argv: []string{argv0}})
		var se *sandbox.SpawnError
		require.ErrorAs(t, err, &se, argv0)
		require.Equal(t, "spawn", se.Sandbox)
		require.Equal(t, "p", se.Process)
		require.ErrorIs(t, err, sandbox.ErrInvalid)
	}
}

func TestLocalArgv0UsesChildPATH(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	sb := b.create(t, "path", nil)
	bin := filepath.Join(b.root, "path", "work", "bin")
	require.NoError(t, os.Mkdir(bin, 0o755))
	exe, err := os.Executable()
	require.NoError(t, err)
	require.NoError(t, os.Symlink(exe, filepath.Join(bin, "sandboxtest-child")))

	argv := []string{"sandboxtest-child", sandboxtest.ChildFlag, "echo found"}
	_, err = sb.Start(testCtx(t), sandbox.ProcSpec{ID: "worker-path", Argv: argv})
	require.ErrorIs(t, err, sandbox.ErrInvalid, "not in the worker's PATH")
	out, st := run(t, sb, sandbox.ProcSpec{Argv: argv, Env: map[string]string{"PATH": "relative/bin:" + bin}})
	require.Equal(t, 0, st.Code)
	require.Equal(t, "found\n", out)
}

func TestLocalDuplicateProcessID(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	sb := b.create(t, "dup", nil)
	_, _ = run(t, sb, sandbox.ProcSpec{ID: "once"}, "exit 0")
	_, err := sb.Start(testCtx(t), sandbox.ProcSpec{ID: "once", Argv: sandboxtest.ChildArgv("exit 0")})
	require.ErrorIs(t, err, sandbox.ErrInvalid)
}

func TestLocalEscapedDescendantDoesNotHang(t *testing.T) {
	t.Parallel()
	// ContainGroup: only then can a descendant escape (see
	// TestLocalKillsEscapedProcesses for the other modes).
	b := setupLocal(t, sandbox.LocalConfig{WaitDelay: 100 * time.Millisecond, Containment: sandbox.ContainGroup})
	sb := b.create(t, "escape", nil)
	ctx := testCtx(t)
	p, err := sb.Start(ctx, sandbox.ProcSpec{ID: "p", Argv: sandboxtest.ChildArgv("fork-detached gc.pid", "echo forked", "stderr 10", "exit 0")})
	require.NoError(t, err)
	br := bufio.NewReader(p.Stdout())
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "forked\n", line)
	pidBytes, err := sb.ReadFile(ctx, "gc.pid")
	require.NoError(t, err)
	pid, err := strconv.Atoi(string(pidBytes))
	require.NoError(t, err)
	// The grandchild left the process group, so the sandbox cannot kill it;
	// the test does.
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })

	// It still holds stdout and stderr open: Wait and stdout must end anyway.
	st, err := p.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, st.Code)
	require.Equal(t, string(sandboxtest.Pattern(10)), st.StderrTail)
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	require.Empty(t, rest)
}

func TestLocalStdoutAfterWait(t *testing.T) {
	t.Parallel()
	// A WaitDelay of 1ns: every read after exit starts past its deadline.
	b := setupLocal(t, sandbox.LocalConfig{WaitDelay: time.Nanosecond})
	sb := b.create(t, "late", nil)
	ctx := testCtx(t)
	p, err := sb.Start(ctx, sandbox.ProcSpec{ID: "p", Argv: sandboxtest.ChildArgv("lines 100 10")})
	require.NoError(t, err)
	st, err := p.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, st.Code)
	// Reading after exit, past WaitDelay, still yields everything.
	out, err := io.ReadAll(p.Stdout())
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	require.Len(t, lines, 100)
	require.Equal(t, sandboxtest.Line(99, 10), lines[99])
}

func TestLocalStopCtxDone(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	sb := b.create(t, "stopctx", nil)
	p, err := sb.Start(testCtx(t), sandbox.ProcSpec{ID: "p", Argv: sandboxtest.ChildArgv("ignore-sigterm", "echo ready", "sleep 1h")})
	require.NoError(t, err)
	br := bufio.NewReader(p.Stdout())
	_, err = br.ReadString('\n')
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	// ctx already done: Stop kills at once instead of waiting out the grace.
	require.ErrorIs(t, p.Stop(ctx, time.Hour), context.Canceled)
	st, err := p.Wait(testCtx(t))
	require.NoError(t, err)
	require.Equal(t, "SIGKILL", st.Signal)
	_, _ = io.Copy(io.Discard, br)
}

// FuzzLocalPaths checks that no path given to WriteFile or ReadFile reaches
// outside the workspace, whatever it holds.
func FuzzLocalPaths(f *testing.F) {
	for _, seed := range []string{
		"a", "a/b/c", "../x", "..", "/etc/passwd", "a/../../x", "./a", "a/./b/../c", "", ".",
		"link/x", "link/../x", "a//b", "a/b/", "a\x00b", "~/x", "..a", "a/..", "link",
	} {
		f.Add(seed)
	}
	parent := f.TempDir()
	outside := filepath.Join(parent, "outside")
	require.NoError(f, os.Mkdir(outside, 0o755))
	root := filepath.Join(parent, "root")
	l, err := sandbox.NewLocal(sandbox.LocalConfig{Root: root})
	require.NoError(f, err)
	sb, err := l.Create(context.Background(), sandbox.Spec{ID: "fuzz"})
	require.NoError(f, err)
	work := filepath.Join(root, "fuzz", "work")
	require.NoError(f, os.Symlink(outside, filepath.Join(work, "link")))

	f.Fuzz(func(t *testing.T, p string) {
		ctx := context.Background()
		err := sb.WriteFile(ctx, p, []byte("fuzz"))
		if err == nil {
			require.True(t, filepath.IsLocal(p), "WriteFile accepted %q", p)
			got, err := sb.ReadFile(ctx, p)
			require.NoError(t, err)
			require.Equal(t, "fuzz", string(got))
		}
		entries, err := os.ReadDir(outside)
		require.NoError(t, err)
		require.Empty(t, entries, "WriteFile(%q) wrote outside the workspace", p)
		parentEntries, err := os.ReadDir(parent)
		require.NoError(t, err)
		names := make([]string, 0, len(parentEntries))
		for _, e := range parentEntries {
			names = append(names, e.Name())
		}
		slices.Sort(names)
		require.Equal(t, []string{"outside", "root"}, names, "WriteFile(%q) wrote beside the root", p)
	})
}

// TestLocalKillsEscapedProcesses checks that a process a run started that
// left its process group and ignores SIGTERM (as Claude Code's Bash tool
// does with setsid) dies when the run ends: by exiting, by Stop, or by
// Destroy, in each containment mode this machine offers.
func TestLocalKillsEscapedProcesses(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{sandbox.ContainCgroup, sandbox.ContainEnviron} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			if _, err := sandbox.NewLocal(sandbox.LocalConfig{Root: t.TempDir(), Containment: mode}); err != nil {
				require.Equal(t, sandbox.ContainCgroup, mode, "environ mode works on every Linux")
				t.Skipf("this machine offers no writable cgroup v2 hierarchy (the fallback, environ, is tested): %v", err)
			}
			for _, end := range []string{"exit", "stop", "destroy"} {
				t.Run(end, func(t *testing.T) {
					t.Parallel()
					b := setupLocal(t, sandbox.LocalConfig{Containment: mode})
					require.Equal(t, mode, b.local.Containment())
					sb, err := b.local.Create(testCtx(t), sandbox.Spec{ID: "escape-" + end})
					require.NoError(t, err)
					t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
					last := "sleep 1h"
					if end == "exit" {
						last = "exit 0"
					}
					p, err := sb.Start(testCtx(t), sandbox.ProcSpec{ID: "agent", Argv: sandboxtest.ChildArgv("escape gc.pid", "echo escaped", last)})
					require.NoError(t, err)
					br := bufio.NewReader(p.Stdout())
					line, err := br.ReadString('\n')
					require.NoError(t, err)
					require.Equal(t, "escaped\n", line)
					pid := readPID(t, sb, "gc.pid")
					t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // only matters if the test failed
					sid, err := unix.Getsid(pid)
					require.NoError(t, err, "the escaped grandchild runs")
					require.Equal(t, pid, sid, "the grandchild leads a session of its own, out of the run's process group")

					switch end {
					case "stop":
						require.NoError(t, p.Stop(testCtx(t), guard))
					case "destroy":
						require.NoError(t, sb.Destroy(testCtx(t)))
					}
					st, err := p.Wait(testCtx(t))
					require.NoError(t, err)
					if end == "exit" {
						require.Equal(t, 0, st.Code)
					}
					if end != "destroy" { // Destroy closes stdout
						rest, err := io.ReadAll(br)
						require.NoError(t, err, "stdout ends: nothing holds it open any more")
						require.Empty(t, rest)
					}
					requireGone(t, pid)
				})
			}
		})
	}
}

func readPID(t *testing.T, sb sandbox.Sandbox, file string) int {
	t.Helper()
	b, err := sb.ReadFile(testCtx(t), file)
	require.NoError(t, err)
	pid, err := strconv.Atoi(string(b))
	require.NoError(t, err)
	return pid
}

// requireGone waits until pid is dead: gone, or a zombie waiting for init.
func requireGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !sandboxtest.ProcessGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive %s after the run ended", pid, guard)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLocalContainmentAuto(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	want := sandbox.ContainEnviron
	if _, err := sandbox.NewLocal(sandbox.LocalConfig{Root: t.TempDir(), Containment: sandbox.ContainCgroup}); err == nil {
		want = sandbox.ContainCgroup
	}
	require.Equal(t, want, b.local.Containment())
	_, err := sandbox.NewLocal(sandbox.LocalConfig{Root: t.TempDir(), Containment: "pidns"})
	require.ErrorIs(t, err, sandbox.ErrInvalid)
}
