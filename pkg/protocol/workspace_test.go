package protocol

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const goldenSHA = "0123456789abcdef0123456789abcdef01234567"

func workspaceJob() *Job {
	return &Job{ID: "q4", Tenant: "acme", Prompt: "fix the bug", Workspace: &Workspace{
		Repo: "https://git.example.com/acme/app.git", Ref: "v1.2.0", Depth: ptr(0), Branch: "fix/bug-12", Push: true,
	}}
}

func goldenArtifact() *Artifact {
	return &Artifact{
		StartSHA: goldenSHA, EndSHA: "89abcdef0123456789abcdef0123456789abcdef", Branch: "fleet/acme/q4",
		PushError: "remote rejected: non-fast-forward",
		Files: []ArtifactFile{
			{Path: "src/a.go", Status: FileModified, Additions: 3, Deletions: 1},
			{Path: "logo.png", Status: FileAdded, Binary: true},
			{Path: "new.txt", OldPath: "old.txt", Status: FileRenamed},
		},
		FilesTotal: 3, DiffKey: "queries/acme/q4/workspace/diff.patch", DiffBytes: 812,
		BundleKey: "queries/acme/q4/workspace/bundle", BundleBytes: 4096, Additions: 3, Deletions: 1,
	}
}

func workspaceSucceededStatus() *StatusEvent {
	ev := succeededStatus()
	ev.Workspace = goldenArtifact().Summary()
	return ev
}

func TestWorkspaceValidate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", MaxRefBytes+1)
	cases := []struct {
		name  string
		ws    Workspace
		field string // "" = valid
		in    string // part of the reason
	}{
		{name: "https", ws: Workspace{Repo: "https://github.com/a/b.git"}},
		{name: "http with port", ws: Workspace{Repo: "http://127.0.0.1:8080/r.git", Ref: "main", Depth: ptr(0)}},
		{name: "ssh", ws: Workspace{Repo: "ssh://git@host.example/a/b.git", Ref: "refs/heads/x"}},
		{name: "scp", ws: Workspace{Repo: "git@github.com:a/b.git", Branch: "work/x", Push: true}},
		{name: "file", ws: Workspace{Repo: "file:///srv/git/r.git", Ref: goldenSHA}},
		{name: "tag", ws: Workspace{Repo: "https://h/r", Ref: "v1.0.0+build"}},
		{name: "missing repo", ws: Workspace{Ref: "main"}, field: "workspace.repo", in: "required"},
		{name: "credentials", ws: Workspace{Repo: "https://user:tok3n@h/r.git"}, field: "workspace.repo", in: "credentials"},
		{name: "credentials redacted", ws: Workspace{Repo: "https://user:tok3n@h/r.git"}, field: "workspace.repo", in: "xxxxx"},
		{name: "user in https", ws: Workspace{Repo: "https://tok3n@h/r.git"}, field: "workspace.repo", in: "credentials"},
		{name: "ext transport", ws: Workspace{Repo: "ext::sh -c touch% /tmp/x"}, field: "workspace.repo", in: "spaces"},
		{name: "ext no space", ws: Workspace{Repo: "ext::true"}, field: "workspace.repo", in: "must be"},
		{name: "option", ws: Workspace{Repo: "--upload-pack=touch"}, field: "workspace.repo", in: "must be"},
		{name: "space with token", ws: Workspace{Repo: "https://tok3n@h/r .git"}, field: "workspace.repo", in: "spaces"},
		{name: "plain path", ws: Workspace{Repo: "/srv/r.git"}, field: "workspace.repo", in: "must be"},
		{name: "file with host", ws: Workspace{Repo: "file://evil/r.git"}, field: "workspace.repo", in: "file:///"},
		{name: "no host", ws: Workspace{Repo: "https:///r.git"}, field: "workspace.repo", in: "host"},
		{name: "dash host", ws: Workspace{Repo: "ssh://-oProxyCommand=x/r"}, field: "workspace.repo", in: "host"},
		{name: "query", ws: Workspace{Repo: "https://h/r?x=1"}, field: "workspace.repo", in: "query"},
		{name: "ref option", ws: Workspace{Repo: "https://h/r", Ref: "--upload-pack=x"}, field: "workspace.ref", in: "not starting"},
		{name: "ref dotdot", ws: Workspace{Repo: "https://h/r", Ref: "a..b"}, field: "workspace.ref", in: "valid git ref"},
		{name: "ref lock", ws: Workspace{Repo: "https://h/r", Ref: "a.lock"}, field: "workspace.ref", in: "valid git ref"},
		{name: "ref long", ws: Workspace{Repo: "https://h/r", Ref: long}, field: "workspace.ref", in: "at most"},
		{name: "ref space", ws: Workspace{Repo: "https://h/r", Ref: "a b"}, field: "workspace.ref", in: "letters"},
		{name: "depth negative", ws: Workspace{Repo: "https://h/r", Depth: ptr(-1)}, field: "workspace.depth", in: "between"},
		{name: "depth huge", ws: Workspace{Repo: "https://h/r", Depth: ptr(MaxWorkspaceDepth + 1)}, field: "workspace.depth", in: "between"},
		{name: "branch HEAD", ws: Workspace{Repo: "https://h/r", Branch: "HEAD"}, field: "workspace.branch", in: "branch name"},
		{name: "branch refs", ws: Workspace{Repo: "https://h/r", Branch: "refs/heads/x"}, field: "workspace.branch", in: "branch name"},
		{name: "branch trailing slash", ws: Workspace{Repo: "https://h/r", Branch: "x/"}, field: "workspace.branch", in: "valid git ref"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			job := &Job{ID: "q1", Prompt: "p", Workspace: &tc.ws}
			err := job.Validate("", true)
			if tc.field == "" {
				require.NoError(t, err)
				return
			}
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tc.field, ve.Field)
			require.Contains(t, ve.Reason, tc.in)
			require.NotContains(t, err.Error(), "tok3n", "a token in the URL must not be echoed")
		})
	}
}

func TestWorkspaceDefaults(t *testing.T) {
	t.Parallel()
	ws := &Workspace{Repo: "https://h/r"}
	require.Equal(t, DefaultWorkspaceDepth, ws.CloneDepth())
	require.Equal(t, "fleet/acme/q1", ws.WorkBranch("acme", "q1"))
	ws = &Workspace{Repo: "https://h/r", Depth: ptr(0), Branch: "b"}
	require.Equal(t, 0, ws.CloneDepth())
	require.Equal(t, "b", ws.WorkBranch("acme", "q1"))
}

func TestDecodeJobWorkspaceFieldErrors(t *testing.T) {
	t.Parallel()
	_, err := DecodeJob(ContentTypeJSON, []byte(`{"id":"q1","prompt":"p","workspace":{"repo":"https://h/r","depth":"50"}}`))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "workspace.depth", ve.Field)
	b := mustMsgpack(t, map[string]any{"id": "q1", "prompt": "p", "workspace": map[string]any{"repo": "https://h/r", "push": "yes"}})
	_, err = DecodeJob(ContentTypeMsgpack, b)
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "workspace.push", ve.Field)
}

func TestQueryArtifactSubject(t *testing.T) {
	t.Parallel()
	n := NewNames("")
	require.Equal(t, "fleet.query.acme.q1.artifact", n.QueryArtifact("acme", "q1"))
	tenant, id, kind, ok := n.ParseQuerySubject(n.QueryArtifact("acme", "q1"))
	require.True(t, ok)
	require.Equal(t, []string{"acme", "q1", "artifact"}, []string{tenant, id, kind})
}
