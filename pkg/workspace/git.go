package workspace

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// procSeq numbers the git processes so every one has its own ProcSpec.ID
// (an idempotency key for remote providers).
var procSeq atomic.Uint64

// gitCall is one git command run in the sandbox.
type gitCall struct {
	// step names the call in process IDs and errors ("fetch", "diff").
	step string
	args []string
	// auth, when set, is a git config key and secret value given to this
	// one process only, through its stdin (see Checkout's doc).
	authKey, authValue string
	// stdout receives the output; nil keeps it in gitResult.stdout.
	stdout io.Writer
	// network marks a step that talks to the remote: it runs on the
	// worker's side when the sandbox's directory is on this machine
	// (hostgit.go).
	network bool
}

type gitResult struct {
	code   int
	stdout []byte
	stderr string
}

// hardening is prepended to every git command: no hooks, no fsmonitor
// command, no credential helper or prompt of the sandbox's own, no signing.
// A repository the agent worked in is not trusted: these come before its
// own .git/config is read and win over it for these keys.
var hardening = []string{
	"-c", "core.hooksPath=/dev/null",
	"-c", "core.fsmonitor=false",
	"-c", "credential.helper=",
	"-c", "commit.gpgsign=false",
	"-c", "tag.gpgsign=false",
	"-c", "core.askPass=",
	"-c", "diff.external=",
	"-c", "core.pager=cat",
	"-c", "gc.auto=0",
	"-c", "maintenance.auto=false",
	"-c", "init.defaultBranch=fleet-init",
	// A remote that stalls (under 1 KB/s for a minute) ends the transfer:
	// a transient error, retried, rather than a slot held forever.
	"-c", "http.lowSpeedLimit=1000",
	"-c", "http.lowSpeedTime=60",
}

// authScript runs git with one extra config entry whose value is read from
// stdin, so the secret is in neither argv, the sandbox's environment nor a
// file: only in the environment of this git process and its transport
// helper while they run.
const authScript = `IFS= read -r v || [ -n "$v" ] || exit 97
k=$1; shift
GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=$k GIT_CONFIG_VALUE_0=$v exec git "$@"`

func (w *Workspaces) gitEnv() map[string]string {
	allow := "http:https:ssh:git"
	if w.cfg.AllowFile {
		allow += ":file"
	}
	return map[string]string{
		"GIT_TERMINAL_PROMPT": "0",
		"GIT_CONFIG_NOSYSTEM": "1",
		"GIT_CONFIG_GLOBAL":   "/dev/null",
		"GIT_ALLOW_PROTOCOL":  allow,
		"GIT_SSH_COMMAND":     "ssh -o BatchMode=yes",
		"LC_ALL":              "C",
		"GIT_OPTIONAL_LOCKS":  "0",
	}
}

// git runs one git command in sb's workspace and waits for it. err is only
// for a command that could not be run (sandbox trouble); a git failure is a
// non-zero code with git's stderr.
func (w *Workspaces) git(ctx context.Context, sb sandbox.Sandbox, c gitCall) (gitResult, error) {
	if dir, ok := onHost(sb, c); ok {
		return w.hostGit(ctx, dir, c)
	}
	argv := append([]string{"git"}, hardening...)
	argv = append(argv, c.args...)
	var stdin []byte
	if c.authKey != "" {
		argv = append([]string{"sh", "-c", authScript, "fleet-git", c.authKey}, argv[1:]...)
		stdin = []byte(c.authValue + "\n")
	}
	p, err := sb.Start(ctx, sandbox.ProcSpec{
		ID:              "fleet-git-" + c.step + "-" + strconv.FormatUint(procSeq.Add(1), 10),
		Argv:            argv,
		Env:             w.gitEnv(),
		Stdin:           stdin,
		StderrTailBytes: 4 << 10,
	})
	if err != nil {
		return gitResult{}, fmt.Errorf("git %s: %w", c.step, err)
	}
	var buf bytes.Buffer
	out := c.stdout
	if out == nil {
		out = &buf
	}
	_, copyErr := io.Copy(out, p.Stdout())
	if copyErr != nil {
		// Drain so the process can end.
		_, _ = io.Copy(io.Discard, p.Stdout())
	}
	st, err := p.Wait(ctx)
	if err != nil {
		return gitResult{}, fmt.Errorf("git %s: %w", c.step, err)
	}
	if copyErr != nil {
		return gitResult{}, fmt.Errorf("git %s: output: %w", c.step, copyErr)
	}
	return gitResult{code: st.Code, stdout: buf.Bytes(), stderr: strings.TrimSpace(st.StderrTail)}, nil
}

// mustGit runs a git command that is expected to succeed.
func (w *Workspaces) mustGit(ctx context.Context, sb sandbox.Sandbox, step string, args ...string) (string, error) {
	r, err := w.git(ctx, sb, gitCall{step: step, args: args})
	if err != nil {
		return "", err
	}
	if r.code != 0 {
		return "", fmt.Errorf("git %s: exit %d: %s", step, r.code, lastLines(r.stderr))
	}
	return strings.TrimSpace(string(r.stdout)), nil
}

// lastLines keeps the end of git's stderr for a message.
func lastLines(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 600 {
		s = "…" + s[len(s)-600:]
	}
	return s
}
