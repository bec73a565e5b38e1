// Package workspacetest holds real-git fixtures for workspace tests (a bare
// repository with branches, a tag and a binary file; a git http-backend
// behind basic auth) and Exercise, the suite every sandbox provider passes
// with package workspace.
package workspacetest

import (
	"bytes"
	"crypto/subtle"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Git runs git in dir with a fixed identity and no user or system config,
// failing the test on error. It returns stdout, trimmed.
func Git(tb testing.TB, dir string, args ...string) string {
	tb.Helper()
	out, err := GitErr(dir, args...)
	require.NoError(tb, err, "git %v", args)
	return strings.TrimSpace(out)
}

// GitErr runs git like Git and returns its error (with stderr) instead.
func GitErr(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.invalid",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.invalid", "LC_ALL=C")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &gitError{err: err, stderr: stderr.String()}
	}
	return stdout.String(), nil
}

type gitError struct {
	err    error
	stderr string
}

func (e *gitError) Error() string { return e.err.Error() + ": " + e.stderr }

// Repo is a bare repository made for a test.
type Repo struct {
	// Bare is the bare repository's directory; URL is file://<Bare>.
	Bare, URL string
	// Main, Feature are the tips of branches main and feature; Tag is the
	// commit of tag v1 (annotated); First is main's first commit.
	Main, Feature, Tag, First string
	// Commits is the number of commits on main.
	Commits int
}

// Binary is the content of logo.bin, a file git treats as binary.
var Binary = []byte{0x89, 'P', 'N', 'G', 0, 1, 2, 3, 0, 0xff, 0xfe, 0}

// NewRepo makes a bare repository under dir: main with 4 commits (src/a.go,
// README.md, del.txt, logo.bin, .gitignore ignoring build/), an annotated
// tag v1 on main's second commit, and a branch feature with one more commit.
func NewRepo(tb testing.TB, dir string) *Repo {
	tb.Helper()
	work := filepath.Join(dir, "seed")
	bare := filepath.Join(dir, "origin.git")
	require.NoError(tb, os.MkdirAll(filepath.Join(work, "src"), 0o755))
	Git(tb, dir, "init", "-q", "-b", "main", work)
	write := func(name, content string) {
		require.NoError(tb, os.MkdirAll(filepath.Dir(filepath.Join(work, name)), 0o755))
		require.NoError(tb, os.WriteFile(filepath.Join(work, name), []byte(content), 0o644))
	}
	commit := func(msg string) string {
		Git(tb, work, "add", "-A")
		Git(tb, work, "commit", "-q", "-m", msg)
		return Git(tb, work, "rev-parse", "HEAD")
	}
	r := &Repo{Bare: bare, URL: "file://" + bare}
	write("README.md", "# demo\n")
	write(".gitignore", "build/\n")
	r.First = commit("first")
	write("src/a.go", "package a\n\nfunc A() int { return 1 }\n")
	write("del.txt", "to be deleted\n")
	r.Tag = commit("second")
	Git(tb, work, "tag", "-a", "-m", "release 1", "v1")
	require.NoError(tb, os.WriteFile(filepath.Join(work, "logo.bin"), Binary, 0o644))
	commit("third: a binary")
	write("README.md", "# demo\n\nMore words.\n")
	r.Main = commit("fourth")
	r.Commits = 4
	Git(tb, work, "checkout", "-q", "-b", "feature")
	write("feature.txt", "feature work\n")
	r.Feature = commit("feature")
	Git(tb, work, "checkout", "-q", "main")
	Git(tb, dir, "clone", "-q", "--bare", work, bare)
	Git(tb, bare, "config", "http.receivepack", "true")
	Git(tb, bare, "config", "uploadpack.allowAnySHA1InWant", "true")
	return r
}

// Server serves the bare repositories under a root over HTTP with git
// http-backend behind net/http/cgi, on loopback, with basic auth that only
// User and Token pass.
type Server struct {
	URL         string // http://127.0.0.1:<port>
	User, Token string
	// Requests counts the requests that reached git (auth passed).
	Requests func() int
	// FailNext makes that many coming requests fail with 503 (a transient
	// server fault).
	FailNext atomic.Int32
}

// Serve serves root (a directory of bare repositories) until the test ends.
func Serve(tb testing.TB, root, user, token string) *Server {
	tb.Helper()
	gitPath, err := exec.LookPath("git")
	require.NoError(tb, err)
	backend := &cgi.Handler{
		Path: gitPath,
		Args: []string{"http-backend"},
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"},
	}
	ch := make(chan int, 1)
	ch <- 0
	s := &Server{User: user, Token: token}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.FailNext.Add(-1) >= 0 {
			http.Error(w, "injected fault", http.StatusServiceUnavailable)
			return
		}
		s.FailNext.Store(0)
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		ch <- <-ch + 1
		backend.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	s.URL = "http://" + ln.Addr().String()
	s.Requests = func() int {
		v := <-ch
		ch <- v
		return v
	}
	return s
}
