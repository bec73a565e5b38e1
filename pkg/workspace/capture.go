package workspace

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Capture records the work done in the checkout, whatever the agent left:
// its own commits plus every uncommitted and untracked change that
// .gitignore does not exclude (deletions and binary files included), as one
// extra commit by the fleet identity when needed. The work branch then
// points at end_sha. It stores the diff (git diff --binary start_sha
// end_sha) and a bundle of the branch with start_sha as prerequisite (none
// when nothing changed), and pushes the branch when the spec says so. A
// rejected push is reported in Artifact.PushError and loses nothing.
//
// The repository is the agent's and not trusted: hooks, fsmonitor, external
// diff drivers and credential helpers are off for every git command, and the
// push goes out of a fresh repository of the fleet's that only borrows the
// objects.
func (w *Workspaces) Capture(ctx context.Context, sb sandbox.Sandbox, base Base) (protocol.Artifact, error) {
	spec := base.Spec
	a := protocol.Artifact{StartSHA: base.StartSHA, Branch: base.Branch, Files: []protocol.ArtifactFile{}}
	if _, err := w.mustGit(ctx, sb, "add", "add", "-A"); err != nil {
		return a, fmt.Errorf("workspace: capture: %w", err)
	}
	r, err := w.git(ctx, sb, gitCall{step: "staged", args: []string{"diff", "--cached", "--quiet", "--no-ext-diff"}})
	if err != nil {
		return a, fmt.Errorf("workspace: capture: %w", err)
	}
	if r.code != 0 {
		msg := "agentfleet: uncommitted work of " + spec.Tenant + "/" + spec.ID
		if _, err := w.mustGit(ctx, sb, "commit",
			"-c", "user.name="+CommitName, "-c", "user.email="+CommitEmail,
			"commit", "-q", "--no-verify", "--allow-empty-message", "-m", msg); err != nil {
			return a, fmt.Errorf("workspace: capture: %w", err)
		}
	}
	end, err := w.mustGit(ctx, sb, "head", "rev-parse", "--verify", "HEAD^{commit}")
	if err != nil {
		return a, fmt.Errorf("workspace: capture: %w", err)
	}
	a.EndSHA = end
	if _, err := w.mustGit(ctx, sb, "branch", "update-ref", "refs/heads/"+base.Branch, end); err != nil {
		return a, fmt.Errorf("workspace: capture: %w", err)
	}
	if err := w.manifest(ctx, sb, &a); err != nil {
		return a, err
	}
	a.DiffKey = storage.DiffKey(spec.Tenant, spec.ID)
	a.DiffBytes, err = w.storeOutput(ctx, sb, a.DiffKey, gitCall{step: "diff",
		args: []string{"diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", base.StartSHA, end}})
	if err != nil {
		return a, err
	}
	// No bundle when the branch gained nothing over start_sha (nothing
	// changed, or the agent only moved it back to an ancestor, which
	// start_sha's history already holds): git refuses an empty bundle.
	r, err = w.git(ctx, sb, gitCall{step: "ancestor", args: []string{"merge-base", "--is-ancestor", end, base.StartSHA}})
	if err != nil {
		return a, fmt.Errorf("workspace: capture: %w", err)
	}
	if r.code != 0 {
		a.BundleKey = storage.BundleKey(spec.Tenant, spec.ID)
		a.BundleBytes, err = w.storeOutput(ctx, sb, a.BundleKey, gitCall{step: "bundle",
			args: []string{"bundle", "create", "-q", "-", "refs/heads/" + base.Branch, "^" + base.StartSHA}})
		if err != nil {
			return a, err
		}
	}
	if spec.Workspace.Push {
		if err := w.push(ctx, sb, base, end); err != nil {
			a.PushError = err.Error()
		} else {
			a.Pushed = true
		}
	}
	return a, nil
}

// manifest fills a's file list and totals from git diff --numstat and
// --name-status between start and end (renames detected).
func (w *Workspaces) manifest(ctx context.Context, sb sandbox.Sandbox, a *protocol.Artifact) error {
	common := []string{"diff", "-z", "-M", "--no-ext-diff", "--no-textconv", a.StartSHA, a.EndSHA}
	num, err := w.git(ctx, sb, gitCall{step: "numstat", args: append([]string{common[0], "--numstat"}, common[1:]...)})
	if err == nil && num.code != 0 {
		err = fmt.Errorf("git diff --numstat: exit %d: %s", num.code, lastLines(num.stderr))
	}
	if err != nil {
		return fmt.Errorf("workspace: capture: %w", err)
	}
	names, err := w.git(ctx, sb, gitCall{step: "namestatus", args: append([]string{common[0], "--name-status"}, common[1:]...)})
	if err == nil && names.code != 0 {
		err = fmt.Errorf("git diff --name-status: exit %d: %s", names.code, lastLines(names.stderr))
	}
	if err != nil {
		return fmt.Errorf("workspace: capture: %w", err)
	}
	files, err := parseDiff(num.stdout, names.stdout)
	if err != nil {
		return fmt.Errorf("workspace: capture: %w", err)
	}
	if files == nil {
		files = []protocol.ArtifactFile{} // "files":[] on the wire, never null
	}
	a.FilesTotal = len(files)
	for _, f := range files {
		a.Additions += f.Additions
		a.Deletions += f.Deletions
	}
	if len(files) > protocol.MaxArtifactFiles {
		files, a.Truncated = files[:protocol.MaxArtifactFiles], true
	}
	a.Files = files
	return nil
}

// parseDiff joins git diff -z --numstat and -z --name-status output, which
// list the same files in the same order.
func parseDiff(numstat, nameStatus []byte) ([]protocol.ArtifactFile, error) {
	var files []protocol.ArtifactFile
	fields := bytes.Split(bytes.TrimSuffix(nameStatus, []byte{0}), []byte{0})
	for i := 0; i < len(fields) && len(fields[i]) > 0; {
		code := string(fields[i])
		f := protocol.ArtifactFile{}
		switch code[0] {
		case 'R', 'C':
			if i+2 >= len(fields) {
				return nil, errors.New("git diff --name-status: truncated rename")
			}
			f.Status, f.OldPath, f.Path = protocol.FileRenamed, string(fields[i+1]), string(fields[i+2])
			if code[0] == 'C' {
				f.Status, f.OldPath = protocol.FileAdded, ""
			}
			i += 3
		default:
			if i+1 >= len(fields) {
				return nil, errors.New("git diff --name-status: truncated entry")
			}
			f.Path = string(fields[i+1])
			switch code[0] {
			case 'A':
				f.Status = protocol.FileAdded
			case 'D':
				f.Status = protocol.FileDeleted
			case 'T':
				f.Status = protocol.FileTypeChanged
			default:
				f.Status = protocol.FileModified
			}
			i += 2
		}
		files = append(files, f)
	}
	// numstat: "add\tdel\tpath\0" or, for a rename, "add\tdel\t\0old\0new\0".
	rest := numstat
	for k := 0; len(rest) > 0; k++ {
		head, after, ok := bytes.Cut(rest, []byte{0})
		if !ok {
			return nil, errors.New("git diff --numstat: truncated entry")
		}
		parts := strings.SplitN(string(head), "\t", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("git diff --numstat: bad entry %q", head)
		}
		rest = after
		if parts[2] == "" { // rename: two more paths
			for range 2 {
				if _, rest, ok = bytes.Cut(rest, []byte{0}); !ok {
					return nil, errors.New("git diff --numstat: truncated rename")
				}
			}
		}
		if k >= len(files) {
			return nil, errors.New("git diff: --numstat lists more files than --name-status")
		}
		if parts[0] == "-" {
			files[k].Binary = true
			continue
		}
		files[k].Additions, _ = strconv.Atoi(parts[0])
		files[k].Deletions, _ = strconv.Atoi(parts[1])
	}
	return files, nil
}

// storeOutput stores a git command's stdout under key, streamed when the
// store can take a stream (S3 multipart, files), and returns its size.
func (w *Workspaces) storeOutput(ctx context.Context, sb sandbox.Sandbox, key string, call gitCall) (int64, error) {
	cw := &countingWriter{}
	check := func(r gitResult, err error) error {
		if err == nil && r.code != 0 {
			err = fmt.Errorf("git %s: exit %d: %s", call.step, r.code, lastLines(r.stderr))
		}
		if err != nil {
			return fmt.Errorf("workspace: capture: %w", err)
		}
		return nil
	}
	if sp, ok := w.cfg.Store.(storage.StreamPutter); ok {
		pr, pw := io.Pipe()
		call.stdout = io.MultiWriter(pw, cw)
		done := make(chan error, 1)
		go func() {
			err := sp.PutStream(ctx, key, bufio.NewReaderSize(pr, 256<<10))
			_ = pr.CloseWithError(err) // unblocks git's writer if the store gave up
			done <- err
		}()
		r, err := w.git(ctx, sb, call)
		gitErr := check(r, err)
		if gitErr != nil {
			pw.CloseWithError(gitErr)
		} else {
			pw.Close()
		}
		putErr := <-done
		if gitErr != nil {
			return 0, gitErr
		}
		if putErr != nil {
			return 0, fmt.Errorf("workspace: storing %s: %w", key, putErr)
		}
		return cw.n, nil
	}
	var buf bytes.Buffer
	call.stdout = &buf
	if err := check(w.git(ctx, sb, call)); err != nil {
		return 0, err
	}
	if err := w.cfg.Store.Put(ctx, key, buf.Bytes()); err != nil {
		return 0, fmt.Errorf("workspace: storing %s: %w", key, err)
	}
	return int64(buf.Len()), nil
}

type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// pushDirPrefix names the fleet's own repository the push goes out of: a
// fresh bare repository whose config the agent never touched, borrowing the
// checkout's objects through alternates. Its name ends in random bytes, so
// an agent cannot plant a config there beforehand (git init keeps the
// config of a repository that exists).
const pushDirPrefix = ".git/fleet-push-"

// push pushes end to the work branch of the remote.
func (w *Workspaces) push(ctx context.Context, sb sandbox.Sandbox, base Base, end string) error {
	repo := base.Spec.Workspace.Repo
	var rnd [16]byte
	_, _ = rand.Read(rnd[:])
	pushDir := pushDirPrefix + hex.EncodeToString(rnd[:])
	if _, err := w.mustGit(ctx, sb, "pushinit", "init", "-q", "--bare", pushDir); err != nil {
		return err
	}
	if err := sb.WriteFile(ctx, pushDir+"/objects/info/alternates", []byte("../../objects\n")); err != nil {
		return fmt.Errorf("preparing the push: %w", err)
	}
	if shallow, err := sb.ReadFile(ctx, ".git/shallow"); err == nil {
		if err := sb.WriteFile(ctx, pushDir+"/shallow", shallow); err != nil {
			return fmt.Errorf("preparing the push: %w", err)
		}
	}
	call := gitCall{step: "push", args: []string{"--git-dir=" + pushDir, "push", "-q", "--porcelain", "--no-verify",
		repo, end + ":refs/heads/" + base.Branch}, network: true}
	var err error
	if call.authKey, call.authValue, err = w.auth(sb, base.Spec.Workspace); err != nil {
		return err
	}
	r, err := w.git(ctx, sb, call)
	if err != nil {
		return err
	}
	if r.code != 0 {
		reason := lastLines(r.stderr)
		if out := strings.TrimSpace(string(r.stdout)); out != "" {
			reason = lastLines(out + "\n" + reason)
		}
		if authRefused(r.stderr) {
			reason = w.refusal(sb, repo, call.authKey != "") + " (" + reason + ")"
		}
		return fmt.Errorf("push of %s to %s rejected: %s", base.Branch, protocol.RedactRepo(repo), reason)
	}
	return nil
}
