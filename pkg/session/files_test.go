package session_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

// untar reads an archive into name → content ("/" suffix for directories).
func untar(t *testing.T, archive []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		if h.Typeflag == tar.TypeDir {
			out[strings.TrimSuffix(h.Name, "/")+"/"] = ""
			continue
		}
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		out[h.Name] = string(b)
	}
}

var runSeq atomic.Uint64

// run runs argv in sb and returns its stdout.
func run(t *testing.T, sb sandbox.Sandbox, argv ...string) string {
	t.Helper()
	p, err := sb.Start(t.Context(), sandbox.ProcSpec{ID: "t-run-" + strconv.FormatUint(runSeq.Add(1), 10), Argv: argv})
	require.NoError(t, err)
	b, err := io.ReadAll(p.Stdout())
	require.NoError(t, err)
	st, err := p.Wait(t.Context())
	require.NoError(t, err)
	require.Equal(t, 0, st.Code, st.StderrTail)
	return string(b)
}

// tree lists what the config dir of sb holds for sid, relative to the
// project directories it is in: "<project>|<path> <sha256>" per file.
func tree(t *testing.T, sb sandbox.Sandbox, sid string) map[string]string {
	t.Helper()
	out := run(t, sb, "sh", "-c", `cd "$CLAUDE_CONFIG_DIR/projects" && find . -mindepth 2 \( -path "./*/`+sid+`.jsonl" -o -path "./*/`+sid+`" -o -path "./*/`+sid+`/*" \) -type f -exec sha256sum {} + | sort -k2`)
	files := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		proj, rest, _ := strings.Cut(strings.TrimPrefix(f[1], "./"), "/")
		files[proj+"|"+rest] = f[0]
	}
	return files
}

// withoutProject drops the project directory from tree's keys.
func withoutProject(files map[string]string, proj string) map[string]string {
	out := map[string]string{}
	for k, v := range files {
		p, rest, _ := strings.Cut(k, "|")
		if p == proj {
			out[rest] = v
		}
	}
	return out
}

// subagentReply scripts a turn that runs a Task subagent, as Claude Code
// 2.1.330 does: the main loop asks for the Agent tool, the subagent has a
// conversation of its own, then the main loop answers.
func subagentReply(r *anthropicfake.Request) anthropicfake.Reply {
	switch last := r.LastUserText(); {
	case last == "delegate" && len(r.ToolResults()) == 0:
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Agent", map[string]any{
			"description": "count files", "prompt": "subagent: count the files", "subagent_type": "general-purpose"})}}
	case last == "subagent: count the files":
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("the subagent counted 3")}}
	}
	return echo(r)
}

// TestCheckpointCarriesSubagents runs a real Claude Code session with a
// Task subagent, checkpoints it through a store, and restores it into a
// fresh sandbox: the restored tree (transcript, subagents/agent-*.jsonl and
// .meta.json) equals the original file for file, and --resume continues it
// there with the whole history.
func TestCheckpointCarriesSubagents(t *testing.T) {
	t.Parallel()
	b := setup(t, subagentReply)
	sb1 := b.sandbox(t)
	job := &protocol.Job{ID: "sub1", Session: &protocol.Session{}, Options: protocol.Options{PermissionMode: "bypassPermissions"}}
	s := b.start(t, sb1, job, "")
	turn(t, s, "delegate")
	sid := s.SessionID()
	require.NoError(t, s.Close(t.Context()))

	orig := tree(t, sb1, sid)
	var proj string
	for k := range orig {
		proj, _, _ = strings.Cut(k, "|")
	}
	orig = withoutProject(orig, proj)
	var sub []string
	for k := range orig {
		if strings.HasPrefix(k, sid+"/subagents/agent-") {
			sub = append(sub, k)
		}
	}
	require.Len(t, sub, 2, "Claude Code keeps a subagent's transcript and meta under <sid>/subagents/: %v", orig)

	store := storagetest.NewMem()
	_, err := session.Save(t.Context(), store, sb1, "t1", "sub1", session.Checkpoint{Job: job, ClaudeSessionID: sid, PromptApplied: true, Turn: 1})
	require.NoError(t, err)
	cp, err := session.Load(t.Context(), store, "t1", "sub1")
	require.NoError(t, err)
	require.Equal(t, sid+".tar", cp.Files)

	sb2 := b.sandbox(t)
	require.NoError(t, session.RestoreCheckpoint(t.Context(), store, sb2, "t1", "sub1", cp))
	restored := tree(t, sb2, sid)
	require.Equal(t, orig, withoutProject(restored, session.RestoreProject), "the restored tree equals the original")
	require.Len(t, restored, len(orig), "nothing restored elsewhere")

	s2 := b.start(t, sb2, job, sid)
	out := turn(t, s2, "and now?")
	require.Equal(t, sid, out.Result.SessionID)
	conv := b.fake.Conversation()
	last := conv[len(conv)-1]
	texts := last.UserTexts()
	require.Equal(t, "delegate", texts[0])
	require.Equal(t, "and now?", texts[len(texts)-1])
	require.Contains(t, strings.Join(texts, "\n"), "the subagent counted 3", "the resumed session knows what its subagent said")
	require.NoError(t, s2.Close(t.Context()))
	after := withoutProject(tree(t, sb2, sid), session.RestoreProject)
	for _, k := range sub {
		require.Equal(t, orig[k], after[k], "the resumed session keeps its subagent files")
	}
}

// TestRestoreReplacesNewerCopies: restoring a checkpoint into a sandbox
// that holds a newer copy of the session (the agent went on after the
// checkpoint, then crashed) leaves exactly the checkpoint.
func TestRestoreReplacesNewerCopies(t *testing.T) {
	t.Parallel()
	b := setup(t, echo)
	sb := b.sandbox(t)
	job := &protocol.Job{ID: "re1", Session: &protocol.Session{}}
	s := b.start(t, sb, job, "")
	turn(t, s, "one")
	sid := s.SessionID()
	require.NoError(t, s.Close(t.Context()))
	archive, err := session.SessionFiles(t.Context(), sb, sid, session.DefaultMaxFilesBytes)
	require.NoError(t, err)
	atCheckpoint := untar(t, archive)

	s = b.start(t, sb, job, sid)
	turn(t, s, "two")
	require.NoError(t, s.Close(t.Context()))
	newer, err := session.SessionFiles(t.Context(), sb, sid, session.DefaultMaxFilesBytes)
	require.NoError(t, err)
	require.Contains(t, untar(t, newer)[sid+".jsonl"], `"two"`)

	require.NoError(t, session.RestoreFiles(t.Context(), sb, sid, archive, session.DefaultMaxFilesBytes))
	files := tree(t, sb, sid)
	require.Len(t, files, 1, "one copy of the session: %v", files)
	for k := range files {
		require.True(t, strings.HasPrefix(k, session.RestoreProject+"|"), k)
	}
	back, err := session.SessionFiles(t.Context(), sb, sid, session.DefaultMaxFilesBytes)
	require.NoError(t, err)
	require.Equal(t, atCheckpoint, untar(t, back))
}

// TestSessionFilesLimit: files over the limit are refused with a clear
// error and nothing is stored.
func TestSessionFilesLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, echo)
	sb := b.sandbox(t)
	s := b.start(t, sb, &protocol.Job{ID: "big1", Session: &protocol.Session{}}, "")
	turn(t, s, "hello")
	sid := s.SessionID()
	require.NoError(t, s.Close(t.Context()))
	_, err := session.SessionFiles(t.Context(), sb, sid, 100)
	require.ErrorIs(t, err, session.ErrTooLarge)
	require.ErrorContains(t, err, "over the limit of 100")
	store := storagetest.NewMem()
	_, err = session.SaveMax(t.Context(), store, sb, "t1", "big1", session.Checkpoint{ClaudeSessionID: sid}, 100)
	require.ErrorIs(t, err, session.ErrTooLarge)
	keys, err := store.List(t.Context(), "")
	require.NoError(t, err)
	require.Empty(t, keys)
}

// FuzzCheckFiles: a files archive from storage (outside input) is accepted
// only when every entry is the session's own, with a clean relative name,
// a file or a directory, within the limit, the transcript included.
func FuzzCheckFiles(f *testing.F) {
	const sid = "0b4cd7d2-5bb1-4c5e-9c38-6f3e4c1c2b1a"
	mk := func(entries ...tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			if h.Typeflag == tar.TypeReg {
				h.Size = 3
			}
			_ = tw.WriteHeader(&h)
			if h.Typeflag == tar.TypeReg {
				_, _ = tw.Write([]byte("abc"))
			}
		}
		_ = tw.Close()
		return buf.Bytes()
	}
	ok, _ := session.TranscriptFiles(sid, []byte("{}\n"))
	f.Add(ok, int64(100))
	f.Add(mk(tar.Header{Name: sid + ".jsonl", Typeflag: tar.TypeReg}, tar.Header{Name: sid + "/", Typeflag: tar.TypeDir},
		tar.Header{Name: sid + "/subagents/agent-a1.jsonl", Typeflag: tar.TypeReg}), int64(100))
	f.Add(mk(tar.Header{Name: sid + ".jsonl", Typeflag: tar.TypeReg}, tar.Header{Name: sid + "/../../etc/passwd", Typeflag: tar.TypeReg}), int64(100))
	f.Add(mk(tar.Header{Name: sid + ".jsonl", Typeflag: tar.TypeReg}, tar.Header{Name: sid + "/x", Typeflag: tar.TypeSymlink, Linkname: "/etc"}), int64(100))
	f.Add(mk(tar.Header{Name: "/" + sid + ".jsonl", Typeflag: tar.TypeReg}), int64(100))
	f.Add(mk(tar.Header{Name: sid + ".jsonl", Typeflag: tar.TypeReg}), int64(2))
	f.Add([]byte("not a tar"), int64(100))
	f.Fuzz(func(t *testing.T, archive []byte, max int64) {
		files, err := session.CheckFiles(archive, sid, max)
		if err != nil {
			return
		}
		var total int64
		transcript := false
		for _, fi := range files {
			require.True(t, fi.Name == sid+".jsonl" || fi.Name == sid || strings.HasPrefix(fi.Name, sid+"/"), fi.Name)
			require.NotContains(t, "/"+fi.Name+"/", "/../")
			require.NotContains(t, "/"+fi.Name+"/", "/./")
			total += fi.Size
			transcript = transcript || (fi.Name == sid+".jsonl" && !fi.Dir)
		}
		require.True(t, transcript)
		require.LessOrEqual(t, total, max)
	})
}

// FuzzParseRequest: any line the agent writes is read as a permission
// request only when it is a can_use_tool control_request with a request
// id; nothing panics.
func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"type":"control_request","request_id":"r1","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{"command":"ls"}}}`))
	f.Add([]byte(`{"type":"control_request","request_id":"","request":{"subtype":"can_use_tool"}}`))
	f.Add([]byte(`{"type":"control_request","request_id":"i1","request":{"subtype":"interrupt"}}`))
	f.Add([]byte(`{"type":"control_request","request_id":7,"request":[]}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, line []byte) {
		req, ok := session.ParseRequest(line)
		if !ok {
			require.Zero(t, req.RequestID)
			return
		}
		require.NotEmpty(t, req.RequestID)
	})
}
