package bridgefake_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
)

// TestMain makes the test binary the fake's child program and checks for
// leaked goroutines.
func TestMain(m *testing.M) {
	if !sandboxtest.RunChild() {
		goleak.VerifyTestMain(m)
	}
}

const guard = 2 * time.Minute

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	t.Cleanup(cancel)
	return ctx
}

// do sends a request with the fake's token (or token if non-empty; "-" for
// none) and returns the status and body.
func do(t *testing.T, f *bridgefake.Fake, method, path, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(testCtx(t), method, f.URL()+path, rd)
	require.NoError(t, err)
	switch token {
	case "":
		req.Header.Set("Authorization", "Bearer "+f.Token())
	case "-":
	default:
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// errCode returns the "code" of an error body.
func errCode(t *testing.T, b []byte) string {
	t.Helper()
	var e struct{ Code string }
	require.NoError(t, json.Unmarshal(b, &e), "error body %q", b)
	return e.Code
}

func create(t *testing.T, f *bridgefake.Fake, id string, env map[string]string) {
	t.Helper()
	status, b := do(t, f, http.MethodPut, "/v1/sb/"+id, "", map[string]any{"sleep_after": 600, "env": env})
	require.Equal(t, http.StatusOK, status, "%s", b)
	require.JSONEq(t, `{"id":"`+id+`","ready":true}`, string(b))
}

func start(t *testing.T, f *bridgefake.Fake, sb string, body map[string]any) int {
	t.Helper()
	status, b := do(t, f, http.MethodPost, "/v1/sb/"+sb+"/proc", "", body)
	require.Equal(t, http.StatusOK, status, "%s", b)
	var r struct {
		ProcID string `json:"proc_id"`
		PID    int    `json:"pid"`
	}
	require.NoError(t, json.Unmarshal(b, &r))
	require.Equal(t, body["proc_id"], r.ProcID)
	require.Positive(t, r.PID)
	return r.PID
}

type procStatus struct {
	Status   string `json:"status"`
	ExitCode *int   `json:"exit_code"`
}

func status(t *testing.T, f *bridgefake.Fake, sb, proc string) procStatus {
	t.Helper()
	code, b := do(t, f, http.MethodGet, "/v1/sb/"+sb+"/proc/"+proc, "", nil)
	require.Equal(t, http.StatusOK, code, "%s", b)
	var st procStatus
	require.NoError(t, json.Unmarshal(b, &st))
	return st
}

// waitExited polls the process status until it is no longer running.
func waitExited(t *testing.T, f *bridgefake.Fake, sb, proc string) procStatus {
	t.Helper()
	deadline := time.Now().Add(guard)
	for {
		st := status(t, f, sb, proc)
		if st.Status != "running" {
			return st
		}
		require.True(t, time.Now().Before(deadline), "process %s still running", proc)
		time.Sleep(10 * time.Millisecond)
	}
}

// event is one parsed stream event (the test's own minimal parser, LF only).
type event struct {
	name, data string
	comment    bool
}

// stream reads a whole stream response (it must end by itself).
func stream(t *testing.T, f *bridgefake.Fake, sb, proc, from string) []event {
	t.Helper()
	path := "/v1/sb/" + sb + "/proc/" + proc + "/stream"
	if from != "" {
		path += "?from=" + from
	}
	code, b := do(t, f, http.MethodGet, path, "", nil)
	require.Equal(t, http.StatusOK, code, "%s", b)
	return parseEvents(string(b))
}

func parseEvents(s string) []event {
	var evs []event
	for _, frame := range strings.Split(s, "\n\n") {
		if frame == "" {
			continue
		}
		var ev event
		for _, line := range strings.Split(frame, "\n") {
			switch {
			case strings.HasPrefix(line, ":"):
				ev.comment = true
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			}
		}
		evs = append(evs, ev)
	}
	return evs
}

type outData struct {
	FD  int    `json:"fd"`
	Off int64  `json:"off"`
	B64 string `json:"b64"`
}

// collect joins the out events per fd (checking offsets are contiguous from
// the start offsets) and returns the exit event's data ("" if none).
func collect(t *testing.T, evs []event, from [2]int64) (stdout, stderr string, exit string) {
	t.Helper()
	var bufs [2]bytes.Buffer
	next := from
	for _, ev := range evs {
		switch ev.name {
		case "out":
			var o outData
			require.NoError(t, json.Unmarshal([]byte(ev.data), &o))
			b, err := base64.StdEncoding.DecodeString(o.B64)
			require.NoError(t, err)
			require.Equal(t, next[o.FD-1], o.Off, "contiguous offsets on fd %d", o.FD)
			next[o.FD-1] += int64(len(b))
			bufs[o.FD-1].Write(b)
		case "exit":
			exit = ev.data
		}
	}
	return bufs[0].String(), bufs[1].String(), exit
}

func TestAuth(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	code, b := do(t, f, http.MethodGet, "/healthz", "-", nil)
	require.Equal(t, http.StatusOK, code, "healthz needs no token")
	require.JSONEq(t, `{"ok":true}`, string(b))
	for _, token := range []string{"-", "wrong"} {
		for _, r := range [][2]string{{"PUT", "/v1/sb/a"}, {"POST", "/v1/sb/a/proc"}, {"GET", "/v1/sb/a/proc/p/stream"},
			{"GET", "/v1/sb/a/file?path=x"}, {"DELETE", "/v1/sb/a"}, {"GET", "/v1/nothing"}} {
			code, b := do(t, f, r[0], r[1], token, nil)
			require.Equal(t, http.StatusUnauthorized, code, "%s %s token %q", r[0], r[1], token)
			require.Equal(t, "unauthorized", errCode(t, b))
		}
	}
	require.Equal(t, 12, f.Unauthorized())
	require.Zero(t, f.Creates())
}

func TestNotFound(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	for _, r := range [][2]string{{"POST", "/v1/sb/nope/proc"}, {"GET", "/v1/sb/nope/proc/p"}, {"GET", "/v1/sb/nope/proc/p/stream"},
		{"POST", "/v1/sb/nope/proc/p/kill"}, {"GET", "/v1/sb/nope/file?path=x"}, {"PUT", "/v1/sb/nope/file?path=x"}} {
		code, b := do(t, f, r[0], r[1], "", "{}")
		require.Equal(t, http.StatusNotFound, code, "%s %s", r[0], r[1])
		require.Equal(t, "sandbox_not_found", errCode(t, b))
	}
	create(t, f, "sb", nil)
	for _, r := range [][2]string{{"GET", "/v1/sb/sb/proc/p"}, {"GET", "/v1/sb/sb/proc/p/stream"}, {"POST", "/v1/sb/sb/proc/p/kill"}} {
		code, b := do(t, f, r[0], r[1], "", "{}")
		require.Equal(t, http.StatusNotFound, code, "%s %s", r[0], r[1])
		require.Equal(t, "process_not_found", errCode(t, b))
	}
	code, b := do(t, f, http.MethodGet, "/v1/sb/sb/file?path=missing", "", nil)
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, "workspace_read_not_found", errCode(t, b))
	code, _ = do(t, f, http.MethodGet, "/v1/other", "", nil)
	require.Equal(t, http.StatusNotFound, code)
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	create(t, f, "sb", nil)
	argv := sandboxtest.ChildArgv("exit 0")
	for name, r := range map[string]struct {
		method, path string
		body         any
	}{
		"sandbox id charset":  {"PUT", "/v1/sb/a.b", nil},
		"sandbox id length":   {"PUT", "/v1/sb/" + strings.Repeat("x", 129), nil},
		"create bad json":     {"PUT", "/v1/sb/ok", "{"},
		"create bad env":      {"PUT", "/v1/sb/ok", map[string]any{"env": map[string]string{"A=B": "x"}}},
		"create sleep_after":  {"PUT", "/v1/sb/ok", map[string]any{"sleep_after": "soon"}},
		"start bad json":      {"POST", "/v1/sb/sb/proc", "[1,2"},
		"start no proc_id":    {"POST", "/v1/sb/sb/proc", map[string]any{"argv": argv}},
		"start bad proc_id":   {"POST", "/v1/sb/sb/proc", map[string]any{"proc_id": "a/b", "argv": argv}},
		"start empty argv":    {"POST", "/v1/sb/sb/proc", map[string]any{"proc_id": "p", "argv": []string{}}},
		"start cwd escapes":   {"POST", "/v1/sb/sb/proc", map[string]any{"proc_id": "p", "argv": argv, "cwd": "../.."}},
		"start cwd missing":   {"POST", "/v1/sb/sb/proc", map[string]any{"proc_id": "p", "argv": argv, "cwd": "nodir"}},
		"start stdin escapes": {"POST", "/v1/sb/sb/proc", map[string]any{"proc_id": "p", "argv": argv, "stdin_path": "/etc/passwd"}},
		"start stdin missing": {"POST", "/v1/sb/sb/proc", map[string]any{"proc_id": "p", "argv": argv, "stdin_path": "nofile"}},
		"start timeout":       {"POST", "/v1/sb/sb/proc", map[string]any{"proc_id": "p", "argv": argv, "timeout_ms": -1}},
		"file escapes":        {"PUT", "/v1/sb/sb/file?path=../x", "data"},
		"file absolute":       {"GET", "/v1/sb/sb/file?path=/etc/passwd", nil},
		"file empty path":     {"GET", "/v1/sb/sb/file", nil},
	} {
		code, b := do(t, f, r.method, r.path, "", r.body)
		require.Equal(t, http.StatusBadRequest, code, "%s: %s", name, b)
	}
	require.Zero(t, f.Launches("p"))

	code, b := do(t, f, http.MethodPost, "/v1/sb/sb/proc", "", map[string]any{"proc_id": "nx", "argv": []string{"no-such-program-xyz"}})
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, "spawn_failed", errCode(t, b))

	start(t, f, "sb", map[string]any{"proc_id": "p", "argv": argv})
	for name, path := range map[string]string{"bad from": "/v1/sb/sb/proc/p/stream?from=1", "negative from": "/v1/sb/sb/proc/p/stream?from=-1,0"} {
		code, _ := do(t, f, http.MethodGet, path, "", nil)
		require.Equal(t, http.StatusBadRequest, code, name)
	}
	code, _ = do(t, f, http.MethodPost, "/v1/sb/sb/proc/p/kill", "", map[string]string{"signal": "SIGBOGUS"})
	require.Equal(t, http.StatusBadRequest, code)
}

// TestFileConfinement: files stay inside the workspace, symlinks included.
func TestFileConfinement(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	create(t, f, "sb", nil)
	code, _ := do(t, f, http.MethodPut, "/v1/sb/sb/file?path=a/b/c.txt", "", []byte("hello"))
	require.Equal(t, http.StatusNoContent, code)
	code, b := do(t, f, http.MethodGet, "/v1/sb/sb/file?path=a/b/c.txt", "", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "hello", string(b))
	got, err := os.ReadFile(filepath.Join(f.Workspace("sb"), "a", "b", "c.txt"))
	require.NoError(t, err)
	require.Equal(t, "hello", string(got))

	code, _ = do(t, f, http.MethodGet, "/v1/sb/sb/file?path=a", "", nil)
	require.Equal(t, http.StatusBadRequest, code, "a directory is not a file")

	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600))
	require.NoError(t, os.Symlink(outside, filepath.Join(f.Workspace("sb"), "link")))
	code, _ = do(t, f, http.MethodGet, "/v1/sb/sb/file?path=link/secret", "", nil)
	require.Equal(t, http.StatusBadRequest, code, "reading through a symlink out of the workspace")
	code, _ = do(t, f, http.MethodPut, "/v1/sb/sb/file?path=link/new", "", []byte("x"))
	require.Equal(t, http.StatusBadRequest, code, "writing through a symlink out of the workspace")
	_, err = os.Stat(filepath.Join(outside, "new"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestStartIdempotentAndConflict(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	create(t, f, "sb", nil)
	body := map[string]any{"proc_id": "p", "argv": sandboxtest.ChildArgv("sleep 1h"), "env": map[string]string{"A": "1"}}
	pid1 := start(t, f, "sb", body)
	pid2 := start(t, f, "sb", body)
	require.Equal(t, pid1, pid2)
	require.Equal(t, 2, f.Starts("p"))
	require.Equal(t, 1, f.Launches("p"))

	body["env"] = map[string]string{"A": "2"}
	code, b := do(t, f, http.MethodPost, "/v1/sb/sb/proc", "", body)
	require.Equal(t, http.StatusConflict, code)
	require.Equal(t, "proc_conflict", errCode(t, b))
	require.Equal(t, 1, f.Launches("p"))
}

// TestStreamResume runs a process to its end, then reads its stream from
// offsets: only the bytes after them come back, with their offsets, and
// then the exit event.
func TestStreamResume(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	create(t, f, "sb", nil)
	start(t, f, "sb", map[string]any{"proc_id": "p", "argv": sandboxtest.ChildArgv("echo hello", "stderr 10", "exit 3")})
	st := waitExited(t, f, "sb", "p")
	require.Equal(t, "failed", st.Status)
	require.Equal(t, 3, *st.ExitCode)

	out, errOut, exit := collect(t, stream(t, f, "sb", "p", ""), [2]int64{})
	require.Equal(t, "hello\n", out)
	require.Equal(t, string(sandboxtest.Pattern(10)), errOut)
	require.JSONEq(t, `{"code":3,"status":"failed"}`, exit)

	out, errOut, exit = collect(t, stream(t, f, "sb", "p", "2,4"), [2]int64{2, 4})
	require.Equal(t, "llo\n", out)
	require.Equal(t, string(sandboxtest.Pattern(10)[4:]), errOut)
	require.JSONEq(t, `{"code":3,"status":"failed"}`, exit)

	out, errOut, exit = collect(t, stream(t, f, "sb", "p", "100,100"), [2]int64{100, 100})
	require.Empty(t, out+errOut)
	require.NotEmpty(t, exit)
	require.Equal(t, 3, f.StreamConnects("p"))
}

// TestDropStreamAfter cuts the first connection after exactly 3 bytes; the
// second, resumed, delivers the rest and the exit event.
func TestDropStreamAfter(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	create(t, f, "sb", nil)
	start(t, f, "sb", map[string]any{"proc_id": "p", "argv": sandboxtest.ChildArgv("echo hello")})
	waitExited(t, f, "sb", "p")
	f.DropStreamAfter(3, 1)
	out, _, exit := collect(t, stream(t, f, "sb", "p", ""), [2]int64{})
	require.Equal(t, "hel", out)
	require.Empty(t, exit, "a dropped stream has no exit event")
	out, _, exit = collect(t, stream(t, f, "sb", "p", "3,0"), [2]int64{3, 0})
	require.Equal(t, "lo\n", out)
	require.JSONEq(t, `{"code":0,"status":"completed"}`, exit)
}

func TestExitModes(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	create(t, f, "sb", nil)
	start(t, f, "sb", map[string]any{"proc_id": "p", "argv": sandboxtest.ChildArgv("echo x")})
	waitExited(t, f, "sb", "p")

	f.SetExitMode(bridgefake.ExitOmit)
	out, _, exit := collect(t, stream(t, f, "sb", "p", ""), [2]int64{})
	require.Equal(t, "x\n", out)
	require.Empty(t, exit)

	f.SetExitMode(bridgefake.ExitError)
	evs := stream(t, f, "sb", "p", "")
	last := evs[len(evs)-1]
	require.Equal(t, "error", last.name)
	require.Contains(t, last.data, `"code":"exec_transport_error"`)
}

// TestPings: an idle stream carries ": ping" comments.
func TestPings(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{PingInterval: 10 * time.Millisecond})
	create(t, f, "sb", nil)
	start(t, f, "sb", map[string]any{"proc_id": "p", "argv": sandboxtest.ChildArgv("sleep 1h")})
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, f.URL()+"/v1/sb/sb/proc/p/stream", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+f.Token())
	resp, err := f.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	br := bufio.NewReader(resp.Body)
	for range 3 {
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, ": ping\n", line)
		line, err = br.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "\n", line)
	}
}

func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	fields := strings.Fields(string(b[i+1:]))
	return len(fields) > 0 && (fields[0] == "Z" || fields[0] == "X")
}

func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !cond() {
		require.True(t, time.Now().Before(deadline), msg)
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKillSignalsProcessGroup: /kill reaches the grandchild too, reports
// killed:false once the process has exited, and is recorded.
func TestKillSignalsProcessGroup(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	create(t, f, "sb", nil)
	start(t, f, "sb", map[string]any{"proc_id": "p", "argv": sandboxtest.ChildArgv("fork-grandchild gc.pid", "sleep 1h")})
	var gc int
	eventually(t, func() bool {
		code, b := do(t, f, http.MethodGet, "/v1/sb/sb/file?path=gc.pid", "", nil)
		if code != http.StatusOK {
			return false
		}
		var err error
		gc, err = strconv.Atoi(string(b))
		return err == nil
	}, "grandchild pid file")
	t.Cleanup(func() { _ = syscall.Kill(gc, syscall.SIGKILL) })

	code, b := do(t, f, http.MethodPost, "/v1/sb/sb/proc/p/kill", "", nil) // default SIGTERM
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"killed":true}`, string(b))
	st := waitExited(t, f, "sb", "p")
	require.Equal(t, "killed", st.Status)
	require.Equal(t, 128+int(syscall.SIGTERM), *st.ExitCode)
	eventually(t, func() bool { return processGone(gc) }, "grandchild survived the group kill")

	code, b = do(t, f, http.MethodPost, "/v1/sb/sb/proc/p/kill", "", map[string]string{"signal": "KILL"})
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"killed":false}`, string(b))
	require.Equal(t, []string{"SIGTERM", "SIGKILL"}, f.Kills("p"))
}

func TestTimeoutMS(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	create(t, f, "sb", nil)
	start(t, f, "sb", map[string]any{"proc_id": "p", "argv": sandboxtest.ChildArgv("sleep 1h"), "timeout_ms": 50})
	st := waitExited(t, f, "sb", "p")
	require.Equal(t, "killed", st.Status)
	require.Equal(t, 128+int(syscall.SIGKILL), *st.ExitCode)
}

// TestProcessEnvironment: processes get a container-like environment (base
// + sandbox env + request env), never the test process's.
func TestProcessEnvironment(t *testing.T) {
	t.Setenv("BRIDGEFAKE_PARENT_ONLY", "leaked")
	f := bridgefake.New(t, bridgefake.Options{BaseEnv: map[string]string{"IMAGE_VAR": "img"}})
	create(t, f, "sb", map[string]string{"SB": "sb", "BOTH": "sb"})
	require.NoError(t, os.MkdirAll(filepath.Join(f.Workspace("sb"), "sub"), 0o755))
	start(t, f, "sb", map[string]any{"proc_id": "p", "argv": sandboxtest.ChildArgv("env", "pwd"), "cwd": "sub",
		"env": map[string]string{"PROC": "proc", "BOTH": "proc"}})
	waitExited(t, f, "sb", "p")
	out, _, _ := collect(t, stream(t, f, "sb", "p", ""), [2]int64{})
	envLine, pwd, _ := strings.Cut(out, "\n")
	var env map[string]string
	require.NoError(t, json.Unmarshal([]byte(envLine), &env))
	require.NotContains(t, env, "BRIDGEFAKE_PARENT_ONLY")
	require.Equal(t, bridgefake.DefaultPath, env["PATH"])
	require.Equal(t, "img", env["IMAGE_VAR"])
	require.Equal(t, "sb", env["SB"])
	require.Equal(t, "proc", env["PROC"])
	require.Equal(t, "proc", env["BOTH"])
	require.True(t, strings.HasPrefix(env["HOME"], filepath.Dir(f.Workspace("sb"))), "HOME %q inside the sandbox dir", env["HOME"])
	require.NotEmpty(t, env["CLAUDE_CONFIG_DIR"])
	require.Equal(t, filepath.Join(f.Workspace("sb"), "sub")+"\n", pwd)
	require.Contains(t, f.ProcEnv("sb", "p"), "PROC=proc")
}

// TestDeleteIdempotent: DELETE kills the processes and removes the
// sandbox; deleting again, or an unknown sandbox, is 204 too.
func TestDeleteIdempotent(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	create(t, f, "sb", nil)
	start(t, f, "sb", map[string]any{"proc_id": "p", "argv": sandboxtest.ChildArgv("sleep 1h")})
	ws := f.Workspace("sb")
	for range 2 {
		code, _ := do(t, f, http.MethodDelete, "/v1/sb/sb", "", nil)
		require.Equal(t, http.StatusNoContent, code)
	}
	code, _ := do(t, f, http.MethodDelete, "/v1/sb/never", "", nil)
	require.Equal(t, http.StatusNoContent, code)
	require.Equal(t, 3, f.Deletes())
	_, err := os.Stat(ws)
	require.ErrorIs(t, err, os.ErrNotExist)
	code, _ = do(t, f, http.MethodGet, "/v1/sb/sb/proc/p", "", nil)
	require.Equal(t, http.StatusNotFound, code)
	create(t, f, "sb", nil) // the same ID gives a fresh sandbox
	code, _ = do(t, f, http.MethodGet, "/v1/sb/sb/proc/p", "", nil)
	require.Equal(t, http.StatusNotFound, code)
}

func TestFailCreate(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	f.FailCreate(2)
	for range 2 {
		code, b := do(t, f, http.MethodPut, "/v1/sb/sb", "", nil)
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Equal(t, "CONTAINER_UNAVAILABLE", errCode(t, b))
	}
	create(t, f, "sb", nil)
	f.FailCreateStatus(http.StatusBadRequest, 1)
	code, _ := do(t, f, http.MethodPut, "/v1/sb/sb", "", nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, 4, f.Creates())
}

// TestDeleteKillsProcessesThatLeftTheGroup: a process the sandbox's
// process started in a session of its own (as the agent's Bash tool does)
// is killed when the sandbox is deleted, like the rest of a real sandbox.
func TestDeleteKillsProcessesThatLeftTheGroup(t *testing.T) {
	t.Parallel()
	f := bridgefake.New(t, bridgefake.Options{})
	create(t, f, "sb", nil)
	start(t, f, "sb", map[string]any{"proc_id": "p",
		"argv": []string{"/bin/sh", "-c", "setsid sleep 3600 </dev/null >/dev/null 2>&1 & echo $! > away.pid; exec sleep 3600"}})
	var away int
	eventually(t, func() bool {
		code, b := do(t, f, http.MethodGet, "/v1/sb/sb/file?path=away.pid", "", nil)
		if code != http.StatusOK {
			return false
		}
		var err error
		away, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, "the pid file of the process in its own session")
	t.Cleanup(func() { _ = syscall.Kill(away, syscall.SIGKILL) })
	eventually(t, func() bool {
		sid, err := unix.Getsid(away)
		return err == nil && sid == away
	}, "the process in a session of its own")

	code, _ := do(t, f, http.MethodDelete, "/v1/sb/sb", "", nil)
	require.Equal(t, http.StatusNoContent, code)
	eventually(t, func() bool { return processGone(away) }, "the process that left the group survived the delete")
}
