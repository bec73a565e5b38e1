package bench

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/envcache"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/workspace"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// cacheCheckouts checks a generated repository of files files out twice
// through pkg/workspace with a repository cache that keeps one prepared
// tree, served over HTTP (git http-backend) so the first checkout is a
// real fetch, each into a new sandbox. Between the two it waits until the
// cache has prepared the tree in the background (as it does between jobs)
// and reports how long that took; it returns both times in milliseconds
// and how the cache served each.
type checkoutFigures struct {
	first, second       float64 // pkg/workspace checkouts, ms
	firstBy, secondBy   string  // how the cache served each
	treePrepare         float64 // the background preparation of the tree, ms
	objFirst, objSecond float64 // the cache alone (ls-remote and link), ms
}

func cacheCheckouts(t testing.TB, files int) (fig checkoutFigures) {
	dir := t.TempDir()
	genRepo(t, dir, wsSizes{files: files, fileBytes: 256, commits: 1})
	const user, token = "bench", "bench-token-5e1f"
	srv := workspacetest.Serve(t, dir, user, token)
	creds, err := workspace.ParseCredentials([]byte(strings.Replace(srv.URL, "://", "://"+user+":"+token+"@", 1) + "\n"))
	require.NoError(t, err)
	prepared := make(chan repocache.TreeEvent, 4)
	cache, err := repocache.Open(repocache.Config{Dir: filepath.Join(dir, "repo-cache"), Trees: 1,
		Prepared: func(ev repocache.TreeEvent) { prepared <- ev }})
	require.NoError(t, err)
	require.NoError(t, cache.Start(context.Background()))
	defer func() { require.NoError(t, cache.Stop(context.Background())) }()
	store, err := storage.NewFS(filepath.Join(dir, "store"))
	require.NoError(t, err)
	ws, err := workspace.New(workspace.Config{Store: store, Credentials: creds, Cache: cache})
	require.NoError(t, err)
	local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: filepath.Join(dir, "sandboxes")})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	checkout := func(n int) (float64, string) {
		sb, err := local.Create(ctx, sandbox.Spec{ID: "rc-" + strconv.Itoa(n)})
		require.NoError(t, err)
		defer func() { _ = sb.Destroy(context.Background()) }()
		t0 := time.Now()
		base, err := ws.Checkout(ctx, sb, workspace.Spec{Tenant: "default", ID: "rc" + strconv.Itoa(n),
			Workspace: protocol.Workspace{Repo: srv.URL + "/bench.git"}})
		require.NoError(t, err)
		return float64(time.Since(t0).Microseconds()) / 1000, base.Cache
	}
	fig.first, fig.firstBy = checkout(1)
	select {
	case ev := <-prepared:
		require.NoError(t, ev.Err)
		require.Equal(t, 1, ev.Built)
		fig.treePrepare = float64(ev.Took.Microseconds()) / 1000
	case <-ctx.Done():
		t.Fatal("the tree was not prepared")
	}
	fig.second, fig.secondBy = checkout(2)
	// The second checkout asked for the next job's tree: stopped (and the
	// preparation cancelled) so that it does not load the machine while
	// the cache's own part is measured.
	require.NoError(t, cache.Stop(ctx))
	fig.objFirst, fig.objSecond = cacheAlone(t, ctx, srv, dir)
	return fig
}

// cacheAlone is the repository cache's own part of a checkout, first into
// an empty cache (ls-remote, the mirror's fetch, linking its packs) and
// then again (ls-remote, linking): the objects a checkout needs, without
// writing the working tree, which both checkouts must do alike.
func cacheAlone(t testing.TB, ctx context.Context, srv *workspacetest.Server, dir string) (firstMS, secondMS float64) {
	cache, err := repocache.Open(repocache.Config{Dir: filepath.Join(dir, "repo-cache-alone")})
	require.NoError(t, err)
	url := srv.URL + "/bench.git"
	auth := repocache.Auth{Key: "http." + srv.URL + "/.extraHeader",
		Value: "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(srv.User+":"+srv.Token))}
	var ms [2]float64
	for i := range ms {
		wd := filepath.Join(dir, "alone-"+strconv.Itoa(i))
		workspacetest.Git(t, dir, "init", "-q", wd)
		t0 := time.Now()
		sha, err := cache.LsRemote(ctx, url, "", auth)
		require.NoError(t, err)
		hit, err := cache.Link(ctx, url, sha, auth, filepath.Join(wd, ".git", "objects", "pack"))
		require.NoError(t, err)
		ms[i] = float64(time.Since(t0).Microseconds()) / 1000
		require.Equal(t, i == 1, hit)
		workspacetest.Git(t, wd, "cat-file", "-e", sha+"^{tree}")
	}
	return ms[0], ms[1]
}

// setupScript does real work with real programs: per file, a sha256 of
// generated text and a gzip of the input, so running it costs thousands
// of process starts and some CPU, as an npm ci or a build would.
func setupScript(files int) string {
	return "# inputs: deps.lock\nmkdir -p build\nfor i in $(seq 1 " + strconv.Itoa(files) + "); do\n" +
		"  seq 1 2000 | sha256sum > build/$i.sum\n  gzip -9 -c deps.lock > build/$i.gz\ndone\necho built $(ls build | wc -l) files\n"
}

// setupFigures are medians in milliseconds.
type setupFigures struct {
	run, restore, save float64
	// prepare: making a prepared copy in the background (after a save or
	// a restore, between jobs); copyRestore: a restore that finds none
	// ready and copies, as a job arriving before it is ready gets.
	prepare, copyRestore float64
	files                int
	prepared             bool // every timed restore moved a prepared copy in
}

// setupRestore measures, rounds times: running a setup in a fresh
// checkout (run), and in other fresh checkouts computing its key and
// restoring its cached result, by copying (copyRestore) and, once the
// cache's prepared copy is ready (prepare), from it (restore); save is
// what a miss adds to the run (snapshots before and after, Save).
func setupRestore(t testing.TB, files, rounds int) setupFigures {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	workspacetest.Git(t, dir, "init", "-q", "-b", "main", src)
	require.NoError(t, os.WriteFile(filepath.Join(src, "deps.lock"), []byte(strings.Repeat("dependency@1.0.0\n", 200)), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, ".gitignore"), []byte("build/\n"), 0o644))
	workspacetest.Git(t, src, "add", "-A")
	workspacetest.Git(t, src, "-c", "user.name=b", "-c", "user.email=b@e", "commit", "-q", "-m", "init")
	local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: filepath.Join(dir, "sandboxes")})
	require.NoError(t, err)
	cache, err := envcache.Open(envcache.Config{Dir: filepath.Join(dir, "envs")})
	require.NoError(t, err)
	copier, err := envcache.Open(envcache.Config{Dir: filepath.Join(dir, "envs"), Spares: envcache.NoSpares})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	events := cache.Events()
	require.NoError(t, cache.Start(ctx))
	defer func() { require.NoError(t, cache.Stop(ctx)) }()
	script := setupScript(files)
	n := 0
	checkout := func() (sandbox.Sandbox, string) {
		n++
		sb, err := local.Create(ctx, sandbox.Spec{ID: "env-" + strconv.Itoa(n)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		wd := sb.(sandbox.HostWorkDir).HostWorkDir()
		workspacetest.Git(t, dir, "clone", "-q", src, wd)
		return sb, wd
	}
	restore := func(c *envcache.Cache) (time.Duration, envcache.Result) {
		_, wd := checkout()
		t0 := time.Now()
		key, err := envcache.Key(src, script, wd)
		require.NoError(t, err)
		res, err := c.Restore(ctx, key, wd)
		require.NoError(t, err)
		d := time.Since(t0)
		require.True(t, res.Hit)
		return d, res
	}
	var run, prepared, copied, save, prepare []time.Duration
	fig := setupFigures{prepared: true}
	for i := range rounds {
		sb, wd := checkout()
		before, err := envcache.TakeSnapshot(ctx, sb)
		require.NoError(t, err)
		t0 := time.Now()
		require.NoError(t, envcache.RunSetup(ctx, sb, "", script, func(string) {}))
		run = append(run, time.Since(t0))
		t1 := time.Now()
		after, err := envcache.TakeSnapshot(ctx, sb)
		require.NoError(t, err)
		key, err := envcache.Key(src, script, wd)
		require.NoError(t, err)
		_, err = cache.Save(ctx, key, wd, envcache.Changed(before, after))
		require.NoError(t, err)
		save = append(save, time.Since(t1))
		if i == 0 { // the first save prepares; later ones find the refill ready
			prepare = append(prepare, waitPrepared(t, events, key))
		}

		d, _ := restore(copier)
		copied = append(copied, d)
		d, res := restore(cache)
		prepared = append(prepared, d)
		fig.prepared = fig.prepared && res.Prepared
		fig.files = res.Files
		// The refill, before the next round's setup competes with it.
		prepare = append(prepare, waitPrepared(t, events, key))
		require.Equal(t, 1, cache.Spares(key))
	}
	fig.run, fig.restore, fig.save = median(run), median(prepared), median(save)
	fig.prepare, fig.copyRestore = median(prepare), median(copied)
	return fig
}

// waitPrepared waits for the cache's next preparation of key and returns
// how long it took; the copy is then ready.
func waitPrepared(t testing.TB, events <-chan envcache.Event, key string) time.Duration {
	for {
		select {
		case ev := <-events:
			require.NotEqual(t, envcache.EventPrepareFailed, ev.Kind, "%v", ev.Err)
			if ev.Kind == envcache.EventPrepared && ev.Key == key {
				return ev.Took
			}
		case <-time.After(5 * time.Minute): // a hang's bound, not a measure
			t.Fatal("no prepared copy")
		}
	}
}
