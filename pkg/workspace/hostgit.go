package workspace

// Git's network operations on the worker's side (docs/contained.md: "git for
// workspaces goes through the worker, credentials staying outside"). A
// contained sandbox reaches no remote, and a file:// remote of this
// machine is not even visible inside; its checkout is a directory of this
// machine (sandbox.HostWorkDir), so the fetch of a checkout and the push of
// a capture run here, against that directory, while every other git
// command stays in the sandbox.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// hostGit runs c (a network step: fetch or push) with git on this machine
// in dir, the sandbox's work directory: the hardening flags first, any
// repository trusted (safe.directory: the checkout is the agent's uid's),
// the credential only in this process's environment. What git wrote under
// .git is then given to the directory's owner (the agent's uid when
// contained), so the sandbox's own git keeps working on it.
func (w *Workspaces) hostGit(ctx context.Context, dir string, c gitCall) (gitResult, error) {
	if err := realGitDir(dir); err != nil {
		return gitResult{}, err
	}
	argv := append(slices.Clone(hardening), "-c", "safe.directory=*")
	argv = append(argv, c.args...)
	cmd := exec.CommandContext(ctx, "git", argv...)
	cmd.Dir = dir
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}
	for k, v := range w.gitEnv() {
		env = append(env, k+"="+v)
	}
	if c.authKey != "" {
		env = append(env, "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0="+c.authKey, "GIT_CONFIG_VALUE_0="+c.authValue)
	}
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if c.stdout != nil {
		cmd.Stdout = c.stdout
	}
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return gitResult{}, err
	}
	if err := ChownLike(filepath.Join(dir, ".git"), dir); err != nil {
		return gitResult{}, err
	}
	msg := strings.TrimSpace(stderr.String())
	if c.authValue != "" {
		msg = strings.ReplaceAll(msg, c.authValue, "[redacted]")
	}
	if len(msg) > 4<<10 {
		msg = msg[len(msg)-4<<10:]
	}
	return gitResult{code: cmd.ProcessState.ExitCode(), stdout: stdout.Bytes(), stderr: msg}, nil
}

// realGitDir refuses a checkout whose .git or object store is a symlink:
// git on this machine would follow it to files the sandbox never saw (and
// a push borrows .git/objects).
func realGitDir(dir string) error {
	for _, p := range []string{".git", filepath.Join(".git", "objects")} {
		st, err := os.Lstat(filepath.Join(dir, p))
		if err != nil {
			return err
		}
		if !st.IsDir() {
			return fmt.Errorf("the checkout's %s is not a directory", p)
		}
	}
	return nil
}

// onHost reports the work directory on this machine of sb when c is a
// network step that runs here.
func onHost(sb sandbox.Sandbox, c gitCall) (string, bool) {
	if !c.network {
		return "", false
	}
	hd, ok := sb.(sandbox.HostWorkDir)
	if !ok {
		return "", false
	}
	return hd.HostWorkDir(), true
}

// ChownLike gives everything under root not owned by ref's owner to it:
// what the worker writes into a contained sandbox's checkout (its git, a
// restored setup environment) becomes the agent uid's. Files with more
// than one link are left alone: the packs a checkout borrows from the
// repository cache are its hard links, and chowning one would give the
// agent the cache's copy (repocache.GiveTo). Nothing to do for a
// worker that is not root (it cannot, and its sandbox files are its own).
func ChownLike(root, ref string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	st, err := os.Lstat(ref)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || int(sys.Uid) == os.Geteuid() {
		return nil
	}
	return repocache.GiveTo(root, int(sys.Uid), int(sys.Gid))
}
