package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/workspace"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// agentWork is the stand-in's version of workspacetest.DoAgentWork: a commit
// of its own, then an edit, a deletion, untracked text and binary files and
// an ignored file.
const agentWork = "/standin append=src/b.go commit=agent_add_B append=src/a.go rm=del.txt " +
	"append=notes/new.txt binary=img/pixel.bin append=build/out.o"

func submitWorkspaceJob(t *testing.T, f *fleettest.Fleet, id, prompt string, ws protocol.Workspace) {
	t.Helper()
	b, err := json.Marshal(protocol.Job{ID: id, Prompt: prompt, Workspace: &ws})
	require.NoError(t, err)
	f.PublishJob("default", b, map[string]string{protocol.HeaderMsgID: id})
}

// artifactOf reads the manifest published on the query's .artifact subject.
func artifactOf(t *testing.T, f *fleettest.Fleet, id string) protocol.Artifact {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := f.JS.Stream(ctx, f.Names.QueriesStream())
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(ctx, f.Names.QueryArtifact("default", id))
	require.NoError(t, err)
	var a protocol.Artifact
	require.NoError(t, json.Unmarshal(m.Data, &a))
	return a
}

// fleetWithRunStarted is a fleet with one worker that reports each agent start.
func fleetWithRunStarted(t *testing.T) (*fleettest.Fleet, chan string) {
	t.Helper()
	f := fleettest.New(t, fleettest.Opts{})
	started := make(chan string, 4)
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Test.RunStarted = func(_, id string, _ int) { started <- id }
	}}).W)
	return f, started
}

func TestWorkspaceRunEndToEnd(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	repo := workspacetest.NewRepo(t, t.TempDir())

	submitWorkspaceJob(t, f, "ws-1", agentWork+" cat=src/a.go", protocol.Workspace{Repo: repo.URL, Push: true})
	r := f.Follow("default", "ws-1", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	for _, l := range r.Lines {
		require.NotContains(t, string(l.Data), ": no such file", "a file directive failed: %s", l.Data)
	}
	running := slices.IndexFunc(r.Statuses, func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRunning })
	require.GreaterOrEqual(t, running, 0)
	require.Equal(t, repo.Main, r.Statuses[running].Workspace.StartSHA, "running carries start_sha")
	// The agent ran at the repository root, in a checkout of main.
	require.Contains(t, string(r.Lines[len(r.Lines)-2].Data), "func A() int { return 1 }")

	art := artifactOf(t, f, "ws-1")
	workspacetest.VerifyArtifact(t, context.Background(), f.Objects, repo, art, "default", "ws-1")
	require.True(t, art.Pushed, art.PushError)
	require.Equal(t, art.EndSHA, workspacetest.Git(t, repo.Bare, "rev-parse", "refs/heads/fleet/default/ws-1"))
	ws := r.Final.Workspace
	require.NotNil(t, ws)
	require.Equal(t, protocol.WorkspaceStatus{StartSHA: repo.Main, EndSHA: art.EndSHA, Branch: "fleet/default/ws-1",
		FilesChanged: 5, Additions: art.Additions, Deletions: art.Deletions, Pushed: true}, *ws)
	require.Equal(t, "stand-in <standin@agentfleet.invalid>",
		workspacetest.Git(t, repo.Bare, "log", "-1", "--format=%an <%ae>", art.EndSHA+"^"), "the agent's own commit is kept")
}

func TestWorkspaceCancelMidRunStillCaptures(t *testing.T) {
	t.Parallel()
	f, started := fleetWithRunStarted(t)
	repo := workspacetest.NewRepo(t, t.TempDir())
	submitWorkspaceJob(t, f, "ws-cancel", "/standin append=half-done.txt lines=1 sleep=1h", protocol.Workspace{Repo: repo.URL, Ref: "feature"})
	<-started
	// Wait until the agent has written its file (its report line is out), then cancel.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	seen := make(chan struct{})
	var once sync.Once
	go func() {
		_, _ = f.Client.Follow(ctx, "default", "ws-cancel", true, fleetapi.Follower{Line: func(l fleetapi.Line) {
			if strings.Contains(string(l.Data), "append half-done.txt") {
				once.Do(func() { close(seen) })
			}
		}})
	}()
	<-seen
	require.NoError(t, f.NC.Publish(f.Names.QueryCtl("default", "ws-cancel"), []byte(`{"op":"cancel"}`)))
	r := f.Follow("default", "ws-cancel", wait)
	require.Equal(t, protocol.StateCancelled, r.Final.State)
	require.NotNil(t, r.Final.Workspace)
	require.Equal(t, 1, r.Final.Workspace.FilesChanged)
	art := artifactOf(t, f, "ws-cancel")
	require.Equal(t, repo.Feature, art.StartSHA)
	require.Equal(t, []protocol.ArtifactFile{{Path: "half-done.txt", Status: protocol.FileAdded, Additions: 1}}, art.Files)
	diff, err := f.Objects.Get(context.Background(), storage.DiffKey("default", "ws-cancel"))
	require.NoError(t, err)
	require.Contains(t, string(diff), "+stand-in edit")
}

func TestWorkspaceMissingRefFailsOnceWithoutRunningTheAgent(t *testing.T) {
	t.Parallel()
	f, started := fleetWithRunStarted(t)
	repo := workspacetest.NewRepo(t, t.TempDir())
	submitWorkspaceJob(t, f, "ws-missing", "never runs", protocol.Workspace{Repo: repo.URL, Ref: "no-such-branch"})
	r := f.Follow("default", "ws-missing", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, 1, r.Final.Attempt, "not retried")
	require.Equal(t, protocol.CodeWorkspaceCheckout, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, repo.URL)
	require.Contains(t, r.Final.Error.Message, "no-such-branch")
	require.Len(t, r.Lines, 1, "only the synthetic result: the agent never started")
	require.Empty(t, started)
	require.False(t, slices.ContainsFunc(r.Statuses, func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRetrying }))
}

// TestWorkspaceCredentialsNeverReachTheAgent serves the repository over
// HTTP behind basic auth that only the worker's token passes; the agent
// dumps its environment and .git/config into the transcript, and neither
// the transcript nor the stored diff and bundle hold the token.
func TestWorkspaceCredentialsNeverReachTheAgent(t *testing.T) {
	t.Parallel()
	const user, token = "fleet-bot", "e2e-T0KEN-c0ffee"
	tmp := t.TempDir()
	repo := workspacetest.NewRepo(t, tmp)
	srv := workspacetest.Serve(t, tmp, user, token)
	creds, err := workspace.ParseCredentials([]byte(strings.Replace(srv.URL, "://", "://"+user+":"+token+"@", 1)))
	require.NoError(t, err)
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		ws, err := workspace.New(workspace.Config{Store: f.Objects, Credentials: creds})
		require.NoError(t, err)
		c.Workspaces = ws
	}})
	fleettest.WaitReady(t, w.W)
	submitWorkspaceJob(t, f, "ws-cred", agentWork+" dumpenv=1 cat=.git/config", protocol.Workspace{Repo: srv.URL + "/origin.git", Push: true})
	r := f.Follow("default", "ws-cred", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.True(t, r.Final.Workspace.Pushed, r.Final.Workspace.PushError)
	require.Equal(t, r.Final.Workspace.EndSHA, workspacetest.Git(t, repo.Bare, "rev-parse", "refs/heads/fleet/default/ws-cred"))

	secrets := []string{token, base64.StdEncoding.EncodeToString([]byte(user + ":" + token))}
	transcript := string(f.Transcript(f.Objects, "default", "ws-cred"))
	require.Contains(t, transcript, "PATH=", "the agent did dump its environment")
	require.Contains(t, transcript, "[remote \\\"origin\\\"]", "the agent did read .git/config")
	art := artifactOf(t, f, "ws-cred")
	diff, err := f.Objects.Get(context.Background(), art.DiffKey)
	require.NoError(t, err)
	bundle, err := f.Objects.Get(context.Background(), art.BundleKey)
	require.NoError(t, err)
	for _, sec := range secrets {
		require.NotContains(t, transcript, sec)
		require.NotContains(t, string(diff), sec)
		require.NotContains(t, string(bundle), sec)
	}
}

// TestWorkspaceTransientFetchErrorIsRetried: the git server answers 503
// once; the attempt is an infrastructure failure and the next one runs.
func TestWorkspaceTransientFetchErrorIsRetried(t *testing.T) {
	t.Parallel()
	f, srv, repo := fleetWithServedRepo(t, fleettest.Opts{})
	srv.FailNext.Store(1)
	submitWorkspaceJob(t, f, "ws-flaky", "/standin append=x.txt", protocol.Workspace{Repo: srv.URL + "/origin.git"})
	r := f.Follow("default", "ws-flaky", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.Equal(t, 2, r.Final.Attempt)
	i := slices.IndexFunc(r.Statuses, func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRetrying && ev.Error != nil })
	require.GreaterOrEqual(t, i, 0, "the failed attempt says why")
	require.Contains(t, r.Statuses[i].Error.Message, "workspace checkout")
	require.Equal(t, repo.Main, r.Final.Workspace.StartSHA)
}

// TestCLIWorkspace: submit --repo … --follow ends with the changed files,
// and diff prints the stored diff (which applies to start_sha) or, with
// --stat, the file list.
func TestCLIWorkspace(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	url := f.Srv.ClientURL()
	repo := workspacetest.NewRepo(t, t.TempDir())

	code, out, errOut := runCLI(t, url, "", "submit", "--id", "cli-ws", "--follow", "--repo", repo.URL, "--push", "--depth", "0",
		"/standin append=src/a.go rm=del.txt binary=img/pixel.bin")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	status := strings.Index(out, "[status] succeeded")
	files := strings.Index(out, "[workspace] fleet/default/cli-ws · 3 files · +1 −1")
	require.True(t, status >= 0 && files > status, "the file list ends the output:\n%s", out)
	require.Contains(t, out, "· checked out "+repo.Main[:12], "running shows the start commit")
	for _, want := range []string{"M src/a.go +1 −0", "D del.txt +0 −1", "A img/pixel.bin (binary)", "· pushed"} {
		require.Contains(t, out[files:], want)
	}

	code, stat, errOut := runCLI(t, url, "", "diff", "cli-ws", "--stat")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Equal(t, out[files:], stat)

	code, diff, errOut := runCLI(t, url, "", "diff", "cli-ws", "--storage", "file://"+filepath.Join(f.Dir, "data"))
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	dir := t.TempDir()
	workspacetest.Git(t, dir, "clone", "-q", repo.URL, "c")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "p.patch"), []byte(diff), 0o644))
	workspacetest.Git(t, filepath.Join(dir, "c"), "apply", "--index", "../p.patch")
	require.Equal(t, workspacetest.Git(t, repo.Bare, "rev-parse", "fleet/default/cli-ws^{tree}"),
		workspacetest.Git(t, filepath.Join(dir, "c"), "write-tree"))

	// Usage errors name the flag; a query without a workspace has no diff.
	code, _, errOut = runCLI(t, url, "", "submit", "--push", "hi")
	require.Equal(t, fleetcli.ExitUsage, code)
	require.Contains(t, errOut, "--push needs --repo")
	code, _, errOut = runCLI(t, url, "", "submit", "--repo", "https://tok@h/r.git", "hi")
	require.Equal(t, fleetcli.ExitRejected, code)
	require.Contains(t, errOut, "workspace.repo")
	require.NotContains(t, errOut, "tok@")
	code, _, _ = runCLI(t, url, "", "submit", "--id", "plain", "--follow", "hi")
	require.Equal(t, fleetcli.ExitOK, code)
	code, _, errOut = runCLI(t, url, "", "diff", "plain")
	require.Equal(t, fleetcli.ExitNotFound, code, errOut)
}

// TestWorkspaceTimeoutStillCaptures: a run stopped by options.timeout_s
// still brings its work back.
func TestWorkspaceTimeoutStillCaptures(t *testing.T) {
	t.Parallel()
	f, _ := fleetWithRunStarted(t)
	repo := workspacetest.NewRepo(t, t.TempDir())
	one := 1
	b, err := json.Marshal(protocol.Job{ID: "ws-timeout", Prompt: "/standin append=slow.txt sleep=1h",
		Options: protocol.Options{TimeoutS: &one}, Workspace: &protocol.Workspace{Repo: repo.URL}})
	require.NoError(t, err)
	f.PublishJob("default", b, nil)
	r := f.Follow("default", "ws-timeout", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, protocol.CodeTimeout, r.Final.Error.Code)
	require.NotNil(t, r.Final.Workspace)
	require.Equal(t, 1, r.Final.Workspace.FilesChanged)
	require.Equal(t, "slow.txt", artifactOf(t, f, "ws-timeout").Files[0].Path)
}

// TestWorkspaceOnCloudflareEndToEnd runs a workspace job through the whole
// fleet on the Cloudflare provider against the Go fake of the bridge, whose
// egress (like the Worker's) holds the git credentials: checkout and push
// over HTTP basic auth, and the agent, which dumps its environment and
// .git/config, never sees the token.
func TestWorkspaceOnCloudflareEndToEnd(t *testing.T) {
	t.Parallel()
	const user, token = "cf-bot", "cf-T0KEN-feedbeef"
	tmp := t.TempDir()
	repo := workspacetest.NewRepo(t, tmp)
	srv := workspacetest.Serve(t, tmp, user, token)
	creds, err := workspace.ParseCredentials([]byte(strings.Replace(srv.URL, "://", "://"+user+":"+token+"@", 1)))
	require.NoError(t, err)
	fake := bridgefake.New(t, bridgefake.Options{GitCredentials: creds})
	cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{BaseURL: fake.URL(), Token: fake.Token(), HTTPClient: fake.Client()})
	require.NoError(t, err)
	t.Cleanup(cf.Close)
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Providers[protocol.SandboxCloudflare] = cf
		c.DefaultSandbox = protocol.SandboxCloudflare
	}})
	fleettest.WaitReady(t, w.W)
	submitWorkspaceJob(t, f, "ws-cf", agentWork+" dumpenv=1 cat=.git/config", protocol.Workspace{Repo: srv.URL + "/origin.git", Push: true})
	r := f.Follow("default", "ws-cf", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	art := artifactOf(t, f, "ws-cf")
	workspacetest.VerifyArtifact(t, context.Background(), f.Objects, repo, art, "default", "ws-cf")
	require.True(t, art.Pushed, art.PushError)
	require.Equal(t, art.EndSHA, workspacetest.Git(t, repo.Bare, "rev-parse", "refs/heads/fleet/default/ws-cf"))
	transcript := string(f.Transcript(f.Objects, "default", "ws-cf"))
	require.Contains(t, transcript, "[remote \\\"origin\\\"]")
	for _, sec := range []string{token, base64.StdEncoding.EncodeToString([]byte(user + ":" + token))} {
		require.NotContains(t, transcript, sec)
	}
}

// A job dead-lettered after attempts that each failed with a reason (here
// its checkout) ends with that reason in its failed status, not only in
// the retrying statuses before it.
func TestDeadLetteredJobKeepsTheLastAttemptsReason(t *testing.T) {
	t.Parallel()
	f, srv, _ := fleetWithServedRepo(t, fleettest.Opts{MaxDeliver: 2})
	srv.FailNext.Store(100)
	submitWorkspaceJob(t, f, "ws-dead", "/standin append=x.txt", protocol.Workspace{Repo: srv.URL + "/origin.git"})
	r := f.Follow("default", "ws-dead", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, protocol.CodeMaxDeliveries, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, "the last attempt: ")
	require.Contains(t, r.Final.Error.Message, "workspace checkout")
}

// fleetWithServedRepo is a fleet (o) with one worker that checks out from a
// repository served over HTTP with basic auth (git http-backend), whose
// credentials the worker holds.
func fleetWithServedRepo(t *testing.T, o fleettest.Opts) (*fleettest.Fleet, *workspacetest.Server, *workspacetest.Repo) {
	t.Helper()
	tmp := t.TempDir()
	repo := workspacetest.NewRepo(t, tmp)
	srv := workspacetest.Serve(t, tmp, "u", "p")
	creds, err := workspace.ParseCredentials([]byte(strings.Replace(srv.URL, "://", "://u:p@", 1)))
	require.NoError(t, err)
	f := fleettest.New(t, o)
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		ws, err := workspace.New(workspace.Config{Store: f.Objects, Credentials: creds})
		require.NoError(t, err)
		c.Workspaces = ws
	}})
	fleettest.WaitReady(t, w.W)
	return f, srv, repo
}
