package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// RestoreProject is the project directory under $CLAUDE_CONFIG_DIR/projects
// that Restore writes a session into. Claude Code's --resume finds a
// session id in any project directory of its config dir, whatever the cwd.
const RestoreProject = "fleet-restored"

var sessionIDRE = regexp.MustCompile(protocol.ResumePattern)

// ErrNoSessionFile: the agent wrote no transcript for the session id.
var ErrNoSessionFile = errors.New("session: no session file in the sandbox")

var helperSeq atomic.Uint64

// SessionFile reads the agent's transcript of claudeSessionID out of sb
// (after the process exited, so it is complete).
func SessionFile(ctx context.Context, sb sandbox.Sandbox, claudeSessionID string) ([]byte, error) {
	if !sessionIDRE.MatchString(claudeSessionID) {
		return nil, fmt.Errorf("session: bad session id %q", claudeSessionID)
	}
	dir, err := configDir(ctx, sb)
	if err != nil {
		return nil, err
	}
	out, err := runHelper(ctx, sb, nil, "find", dir, "-mindepth", "3", "-maxdepth", "3",
		"-path", path.Join(dir, "projects", "*", claudeSessionID+".jsonl"), "-type", "f")
	if err != nil {
		return nil, err
	}
	files := strings.Fields(string(out))
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoSessionFile, claudeSessionID)
	}
	return runHelper(ctx, sb, nil, "cat", files[0])
}

// Restore writes a session transcript into sb's config dir, where
// --resume=<claudeSessionID> finds it.
func Restore(ctx context.Context, sb sandbox.Sandbox, claudeSessionID string, transcript []byte) error {
	if !sessionIDRE.MatchString(claudeSessionID) {
		return fmt.Errorf("session: bad session id %q", claudeSessionID)
	}
	if len(transcript) == 0 {
		return fmt.Errorf("session: empty transcript for %s", claudeSessionID)
	}
	dir, err := configDir(ctx, sb)
	if err != nil {
		return err
	}
	proj := path.Join(dir, "projects", RestoreProject)
	if _, err := runHelper(ctx, sb, nil, "mkdir", "-p", proj); err != nil {
		return err
	}
	_, err = runHelper(ctx, sb, transcript, "dd", "of="+path.Join(proj, claudeSessionID+".jsonl"), "status=none")
	return err
}

func configDir(ctx context.Context, sb sandbox.Sandbox) (string, error) {
	out, err := runHelper(ctx, sb, nil, "printenv", "CLAUDE_CONFIG_DIR")
	if err != nil {
		return "", fmt.Errorf("session: the sandbox has no CLAUDE_CONFIG_DIR: %w", err)
	}
	dir := strings.TrimSpace(string(out))
	if !path.IsAbs(dir) {
		return "", fmt.Errorf("session: CLAUDE_CONFIG_DIR %q is not absolute", dir)
	}
	return dir, nil
}

// runHelper runs argv in sb (stdin from the bytes given) and returns its
// stdout; a non-zero exit is an error carrying the stderr tail.
func runHelper(ctx context.Context, sb sandbox.Sandbox, stdin []byte, argv ...string) ([]byte, error) {
	id := fmt.Sprintf("fleet-session-%s-%d", argv[0], helperSeq.Add(1))
	p, err := sb.Start(ctx, sandbox.ProcSpec{ID: id, Argv: argv, Stdin: stdin})
	if err != nil {
		return nil, fmt.Errorf("session: %s: %w", argv[0], err)
	}
	var out bytes.Buffer
	_, rerr := io.Copy(&out, p.Stdout())
	st, err := p.Wait(ctx)
	if err != nil {
		return nil, fmt.Errorf("session: %s: %w", argv[0], err)
	}
	if rerr != nil {
		return nil, fmt.Errorf("session: %s: read: %w", argv[0], rerr)
	}
	if st.Code != 0 {
		return nil, fmt.Errorf("session: %s exited %d: %s", argv[0], st.Code, strings.TrimSpace(st.StderrTail))
	}
	return out.Bytes(), nil
}
