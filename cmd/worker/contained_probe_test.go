package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// writeCreds writes a NATS user credentials file (a JWT and its seed) for
// an account of its own; a server without authentication accepts it.
func writeCreds(t *testing.T, path string) {
	t.Helper()
	acct, err := nkeys.CreateAccount()
	require.NoError(t, err)
	user, err := nkeys.CreateUser()
	require.NoError(t, err)
	upub, err := user.PublicKey()
	require.NoError(t, err)
	token, err := jwt.NewUserClaims(upub).Encode(acct)
	require.NoError(t, err)
	seed, err := user.Seed()
	require.NoError(t, err)
	b, err := jwt.FormatUserConfig(token, seed)
	require.NoError(t, err)
	// 0644: a root worker's agent runs as another uid, which file modes
	// alone would keep out of a 0600 file; a non-root worker's agent maps
	// to the worker's own uid, which they would not. What must keep it out
	// is that the file is not in the sandbox at all.
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// TestContainedAgentCannotReadTheWorkersFiles: a worker started with the
// default isolation (contained on a machine that can) connects with a
// creds file (beside the agent's program) and keeps storage, journal, repository cache and sandboxes
// on disk; its agent tries to read each and reads none of them: they do not
// exist in its view. The same
// probe with --isolation none reads the creds file (the control: the
// agent would otherwise run as the worker's user, beside them).
func TestContainedAgentCannotReadTheWorkersFiles(t *testing.T) {
	t.Parallel()
	if err := sandbox.CheckContained(); err != nil {
		t.Skipf("contained sandboxes cannot run here: %v", err)
	}
	f := fleettest.New(t, fleettest.Opts{})
	dir := t.TempDir()
	// The creds beside the agent's program: a contained sandbox binds the
	// program's directory, but never one that holds the worker's files.
	bin := filepath.Join(dir, "bin")
	require.NoError(t, os.Mkdir(bin, 0o755))
	agent := filepath.Join(bin, "agent")
	linkOrCopy(t, fleettest.AgentCommand(t)[0], agent)
	creds := filepath.Join(bin, "worker.creds")
	writeCreds(t, creds)
	data, journal, cache, sb := filepath.Join(dir, "data"), filepath.Join(dir, "journal"), filepath.Join(dir, "cache"), filepath.Join(dir, "sb")
	planted := map[string]string{}
	for _, d := range []string{data, journal, cache, sb} {
		require.NoError(t, os.MkdirAll(d, 0o755))
		p := filepath.Join(d, "planted.txt")
		secret := "secret-in-" + filepath.Base(d)
		require.NoError(t, os.WriteFile(p, []byte(secret), 0o644))
		planted[p] = secret
	}
	b, err := os.ReadFile(creds)
	require.NoError(t, err)
	planted[creds] = strings.Split(string(b), "\n")[1] // the JWT: one line, the same in a JSON string
	args := func(isolation ...string) []string {
		return append([]string{"--nats-url", f.Srv.ClientURL(), "--nats-creds", creds, "--storage", "file://" + data,
			"--journal-dir", journal, "--sandbox-dir", sb, "--repo-cache", cache, "--slots", "1",
			"--agent-cmd", agent + " " + fleettest.StandinFlag}, isolation...)
	}
	probe := func(id, path string) fleettest.Run {
		f.SubmitJSON("default", id, "/standin cat="+path)
		return f.Follow("default", id, 2*time.Minute)
	}

	p := fleettest.StartCommand(t, args()...)
	p.Expect(t, `"isolation":"contained"`)
	p.Expect(t, "pulling jobs")
	i := 0
	for path, secret := range planted {
		i++
		r := probe("contained-"+strings.Repeat("x", i), path)
		out := linesOf(r)
		require.Contains(t, out, "cat "+path+": open "+path+": no such file or directory", "not in the sandbox")
		require.NotContains(t, out, secret, path)
		if r.Final.Error != nil {
			require.NotContains(t, r.Final.Error.Message, secret, path)
		}
	}
	code, _, errOut := stopWorker(t, p)
	require.Equal(t, 0, code, errOut)

	p = fleettest.StartCommand(t, args("--isolation", "none")...)
	p.Expect(t, "pulling jobs")
	r := probe("uncontained", creds)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.Contains(t, linesOf(r), planted[creds], "with none, the agent reads the worker's creds")
	code, _, errOut = stopWorker(t, p)
	require.Equal(t, 0, code, errOut)
}

// linesOf is a run's output lines, concatenated.
func linesOf(r fleettest.Run) string {
	var b strings.Builder
	for _, l := range r.Lines {
		b.Write(l.Data)
	}
	return b.String()
}

// linkOrCopy makes dst the same file as src: a hard link, or a copy
// across file systems.
func linkOrCopy(t *testing.T, src, dst string) {
	t.Helper()
	if os.Link(src, dst) == nil {
		return
	}
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dst, b, 0o755))
}
