package session

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strconv"
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

// DefaultMaxFilesBytes bounds a session's files in a checkpoint (the
// transcript, its subagents' transcripts and the rest of the session's
// directory): under Workers KV's 25 MiB value limit and the bridge's 32 MiB
// file limit, so every store and provider takes it.
const DefaultMaxFilesBytes = 24 << 20

// ErrTooLarge: the session's files are over the checkpoint limit.
var ErrTooLarge = errors.New("session: the session's files exceed the checkpoint limit")

// SessionFile reads the agent's transcript of claudeSessionID out of sb
// (after the process exited, so it is complete).
func SessionFile(ctx context.Context, sb sandbox.Sandbox, claudeSessionID string) ([]byte, error) {
	proj, err := projectDir(ctx, sb, claudeSessionID)
	if err != nil {
		return nil, err
	}
	return runHelper(ctx, sb, nil, "cat", path.Join(proj, claudeSessionID+".jsonl"))
}

// projectDir finds the project directory under $CLAUDE_CONFIG_DIR/projects
// that holds claudeSessionID's transcript.
func projectDir(ctx context.Context, sb sandbox.Sandbox, claudeSessionID string) (string, error) {
	if !sessionIDRE.MatchString(claudeSessionID) {
		return "", fmt.Errorf("session: bad session id %q", claudeSessionID)
	}
	if h, ok := sb.(sandbox.HostConfigDir); ok {
		return hostProjectDir(h.HostConfigDir(), claudeSessionID)
	}
	dir, err := configDir(ctx, sb)
	if err != nil {
		return "", err
	}
	out, err := runHelper(ctx, sb, nil, "find", dir, "-mindepth", "3", "-maxdepth", "3",
		"-path", path.Join(dir, "projects", "*", claudeSessionID+".jsonl"), "-type", "f")
	if err != nil {
		return "", err
	}
	files := strings.Fields(string(out))
	if len(files) == 0 {
		return "", fmt.Errorf("%w: %s", ErrNoSessionFile, claudeSessionID)
	}
	return path.Dir(files[0]), nil
}

// hostProjectDir is projectDir for a config dir on this host (a local
// sandbox): looked up there directly, through an os.Root, instead of by two
// helper processes (printenv, find), which every one-shot run that named a
// session spent after its agent exited, most of them finding nothing. Only
// a real directory projects/<p> holding a regular file <sid>.jsonl counts.
func hostProjectDir(dir, claudeSessionID string) (string, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", fmt.Errorf("session: config dir: %w", err)
	}
	defer root.Close()
	projects, err := fs.ReadDir(root.FS(), "projects")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("session: config dir: %w", err)
	}
	for _, p := range projects {
		if !p.IsDir() { // a symlink is not a directory entry of kind dir
			continue
		}
		fi, err := root.Lstat(path.Join("projects", p.Name(), claudeSessionID+".jsonl"))
		if err == nil && fi.Mode().IsRegular() {
			return path.Join(dir, "projects", p.Name()), nil
		}
	}
	return "", fmt.Errorf("%w: %s", ErrNoSessionFile, claudeSessionID)
}

// SessionFiles reads everything Claude Code keeps for claudeSessionID in
// its project directory out of sb, as a tar archive with names relative to
// that directory: the transcript <sid>.jsonl and the session's directory
// <sid>/ (Claude Code 2.1.330 keeps its Task subagents' transcripts there,
// subagents/agent-<id>.jsonl and .meta.json). Files over max bytes in all
// are refused with ErrTooLarge, before anything is copied.
func SessionFiles(ctx context.Context, sb sandbox.Sandbox, claudeSessionID string, max int64) ([]byte, error) {
	proj, err := projectDir(ctx, sb, claudeSessionID)
	if err != nil {
		return nil, err
	}
	// What there is, and how big: "<type> <size> <path>" per entry.
	out, err := runHelper(ctx, sb, nil, "find", proj, "-mindepth", "1", "-maxdepth", "1",
		"(", "-name", claudeSessionID+".jsonl", "-o", "-name", claudeSessionID, ")",
		"-printf", "%y %s %P\\n")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			names = append(names, f[2])
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoSessionFile, claudeSessionID)
	}
	sizes, err := runHelper(ctx, sb, nil, append([]string{"find"}, append(prefixed(proj, names), "-type", "f", "-printf", "%s\\n")...)...)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, l := range strings.Fields(string(sizes)) {
		n, err := strconv.ParseInt(l, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("session: size of the session's files: %q", l)
		}
		total += n
	}
	if total > max {
		return nil, fmt.Errorf("%w: the files of session %s are %d bytes, over the limit of %d", ErrTooLarge, claudeSessionID, total, max)
	}
	archive, err := runHelper(ctx, sb, nil, append([]string{"tar", "-C", proj, "-cf", "-", "--"}, names...)...)
	if err != nil {
		return nil, err
	}
	// tar's headers add to the files; far more than that is not what was
	// measured.
	if int64(len(archive)) > max+max/8+1<<20 {
		return nil, fmt.Errorf("%w: the archive of session %s is %d bytes, over the limit of %d", ErrTooLarge, claudeSessionID, len(archive), max)
	}
	if _, err := CheckFiles(archive, claudeSessionID, max); err != nil {
		return nil, err
	}
	return archive, nil
}

func prefixed(dir string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = path.Join(dir, n)
	}
	return out
}

// FileInfo is one entry of a session's files archive.
type FileInfo struct {
	Name string
	Dir  bool
	Size int64
}

// CheckFiles validates a session's files archive (from storage: outside
// input) before it is restored: a tar whose entries are only the transcript
// <sid>.jsonl (required) and directories and regular files under <sid>/,
// with clean relative names and at most max bytes of file content. It
// returns the entries.
func CheckFiles(archive []byte, claudeSessionID string, max int64) ([]FileInfo, error) {
	if !sessionIDRE.MatchString(claudeSessionID) {
		return nil, fmt.Errorf("session: bad session id %q", claudeSessionID)
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("session: files archive of %s: %s", claudeSessionID, fmt.Sprintf(format, a...))
	}
	tr := tar.NewReader(bytes.NewReader(archive))
	var (
		out        []FileInfo
		total      int64
		transcript bool
	)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, bad("does not read: %v", err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		if name == "" || path.Clean(name) != name || path.IsAbs(name) || strings.HasPrefix(name, "..") {
			return nil, bad("entry %q is not a clean relative name", clip(h.Name))
		}
		if name != claudeSessionID+".jsonl" && name != claudeSessionID && !strings.HasPrefix(name, claudeSessionID+"/") {
			return nil, bad("entry %q is not the session's", clip(h.Name))
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if name == claudeSessionID+".jsonl" {
				return nil, bad("the transcript is a directory")
			}
			out = append(out, FileInfo{Name: name, Dir: true})
			continue
		case tar.TypeReg:
		default:
			return nil, bad("entry %q is neither a file nor a directory", clip(h.Name))
		}
		if name == claudeSessionID {
			return nil, bad("the session's directory is a file")
		}
		if h.Size < 0 || total+h.Size > max {
			return nil, fmt.Errorf("%w: the files of session %s are over %d bytes", ErrTooLarge, claudeSessionID, max)
		}
		total += h.Size
		transcript = transcript || name == claudeSessionID+".jsonl"
		out = append(out, FileInfo{Name: name, Size: h.Size})
	}
	if !transcript {
		return nil, bad("holds no transcript %s.jsonl", claudeSessionID)
	}
	return out, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// TranscriptFiles makes a files archive of a transcript alone (a
// checkpoint stored before checkpoints held the whole session directory).
func TranscriptFiles(claudeSessionID string, transcript []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: claudeSessionID + ".jsonl", Mode: 0o600, Size: int64(len(transcript)), Typeflag: tar.TypeReg}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(transcript); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Restore writes a session transcript into sb's config dir, where
// --resume=<claudeSessionID> finds it.
func Restore(ctx context.Context, sb sandbox.Sandbox, claudeSessionID string, transcript []byte) error {
	if len(transcript) == 0 {
		return fmt.Errorf("session: empty transcript for %s", claudeSessionID)
	}
	archive, err := TranscriptFiles(claudeSessionID, transcript)
	if err != nil {
		return err
	}
	return RestoreFiles(ctx, sb, claudeSessionID, archive, int64(len(transcript)))
}

// RestoreFiles writes a session's files archive (SessionFiles) into sb's
// config dir, under projects/RestoreProject, where --resume finds it. Any
// other copy of the session in the config dir (a project directory the
// agent wrote it to, ahead of this checkpoint) is removed first, so the
// agent resumes from exactly the checkpoint.
func RestoreFiles(ctx context.Context, sb sandbox.Sandbox, claudeSessionID string, archive []byte, max int64) error {
	if _, err := CheckFiles(archive, claudeSessionID, max); err != nil {
		return err
	}
	dir, err := configDir(ctx, sb)
	if err != nil {
		return err
	}
	projects := path.Join(dir, "projects")
	if _, err := runHelper(ctx, sb, nil, "mkdir", "-p", path.Join(projects, RestoreProject)); err != nil {
		return err
	}
	if _, err := runHelper(ctx, sb, nil, "find", projects, "-mindepth", "2", "-maxdepth", "2",
		"(", "-name", claudeSessionID+".jsonl", "-o", "-name", claudeSessionID, ")",
		"-exec", "rm", "-rf", "--", "{}", "+"); err != nil {
		return err
	}
	_, err = runHelper(ctx, sb, archive, "tar", "-C", path.Join(projects, RestoreProject), "--no-same-owner", "-xf", "-")
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
