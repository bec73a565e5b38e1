package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
)

// cfSandbox creates a sandbox on b's provider, destroyed at the end of the test.
func (b *cfBundle) sandbox(t *testing.T, env map[string]string) sandbox.Sandbox {
	t.Helper()
	sb, err := b.cf.Create(testCtx(t), sandbox.Spec{ID: strings.ReplaceAll(t.Name(), "/", "_"), Env: env})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		require.NoError(t, sb.Destroy(ctx))
	})
	return sb
}

// readAllAsync reads r to its end in the background; the result arrives on
// the returned channel.
type readResult struct {
	b   []byte
	err error
}

func readAllAsync(r io.Reader) <-chan readResult {
	ch := make(chan readResult, 1)
	go func() {
		b, err := io.ReadAll(r)
		ch <- readResult{b, err}
	}()
	return ch
}

func recvRead(t *testing.T, ch <-chan readResult) readResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(guard):
		t.Fatal("stdout did not end")
		return readResult{}
	}
}

// syncBuffer is an io.Writer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// expectedLines is what the child's "lines n size" step writes.
func expectedLines(n, size int) string {
	var sb strings.Builder
	for i := range n {
		sb.WriteString(sandboxtest.Line(i, size))
		sb.WriteByte('\n')
	}
	return sb.String()
}

// TestCloudflareStreamDropDeliversEveryByteOnce cuts the exec stream again
// and again mid-run (cleanly and by aborting the connection): the client
// re-attaches with from=<offsets> and delivers 2 MiB of numbered stdout lines
// and all of stderr exactly once, in order.
func TestCloudflareStreamDropDeliversEveryByteOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		abort bool
		times int
	}{
		{"EveryConnectionCleanEOF", false, bridgefake.Always},
		{"EveryConnectionAborted", true, bridgefake.Always},
		{"OnceAborted", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
			b.fake.DropStreamAfter(100_000, tc.times)
			b.fake.SetDropAbort(tc.abort)
			sb := b.sandbox(t, nil)

			const n, size = 21000, 99 // 2,100,000 bytes of stdout
			const stderrBytes = 300_000
			var stderr syncBuffer
			p, err := sb.Start(testCtx(t), sandbox.ProcSpec{
				ID:     "big",
				Argv:   sandboxtest.ChildArgv(fmt.Sprintf("stderr %d", stderrBytes), fmt.Sprintf("lines %d %d", n, size)),
				Stderr: &stderr,
			})
			require.NoError(t, err)
			out := recvRead(t, readAllAsync(p.Stdout()))
			require.NoError(t, out.err)
			st, err := p.Wait(testCtx(t))
			require.NoError(t, err)
			require.Equal(t, 0, st.Code)

			want := expectedLines(n, size)
			require.Len(t, out.b, len(want))
			require.True(t, string(out.b) == want, "stdout differs from the numbered lines")
			require.Equal(t, sandboxtest.Pattern(stderrBytes), stderr.Bytes(), "stderr delivered exactly once")
			require.Equal(t, string(sandboxtest.Pattern(stderrBytes)[stderrBytes-8<<10:]), st.StderrTail)

			wantConnects := 2
			if tc.times == bridgefake.Always {
				wantConnects = (len(want) + stderrBytes + 99_999) / 100_000 // each connection delivers 100,000 bytes
			}
			require.GreaterOrEqual(t, b.fake.StreamConnects("big"), wantConnects, "the stream was cut and re-attached")
			require.Equal(t, 1, b.fake.Launches("big"), "re-attaching never starts the process again")
		})
	}
}

// TestCloudflareCreateRetries503 makes the bridge answer 503 a few times:
// Create retries and succeeds.
func TestCloudflareCreateRetries503(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	b.fake.FailCreate(3)
	sb := b.sandbox(t, nil)
	require.Equal(t, 4, b.fake.Creates(), "three 503s, then success")
	out, st := runCF(t, sb, "p1", sandbox.ProcSpec{}, "echo ok")
	require.Equal(t, "ok\n", out)
	require.Equal(t, 0, st.Code)
}

// TestCloudflareCreateUnavailableAfterReadyTimeout keeps answering 503 for
// longer than ReadyTimeout: Create gives up with a retryable ErrUnavailable.
func TestCloudflareCreateUnavailableAfterReadyTimeout(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{ReadyTimeout: time.Second})
	b.fake.FailCreate(1 << 30)
	_, err := b.cf.Create(testCtx(t), sandbox.Spec{ID: "never-ready"})
	require.ErrorIs(t, err, sandbox.ErrUnavailable)
	require.True(t, sandbox.Retryable(err))
	require.Contains(t, err.Error(), "not ready after")
	require.Greater(t, b.fake.Creates(), 1, "Create retried before giving up")
}

// TestCloudflareCreateSlowColdStart delays the create answer (a cold
// start); Create waits for it within ReadyTimeout.
func TestCloudflareCreateSlowColdStart(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	b.fake.DelayCreate(200 * time.Millisecond)
	b.sandbox(t, nil)
	require.Equal(t, 1, b.fake.Creates())
}

// TestCloudflareCreate4xxNotRetried: a 4xx answer is ErrInvalid, not
// retryable, and sent once.
func TestCloudflareCreate4xxNotRetried(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusBadRequest, http.StatusConflict, http.StatusRequestEntityTooLarge} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
			b.fake.FailCreateStatus(status, 5)
			_, err := b.cf.Create(testCtx(t), sandbox.Spec{ID: "bad"})
			require.ErrorIs(t, err, sandbox.ErrInvalid)
			require.False(t, sandbox.Retryable(err))
			require.Equal(t, 1, b.fake.Creates(), "no retry on %d", status)
		})
	}
}

// TestCloudflareWrongToken: a 401 is ErrInvalid with a message naming the
// token problem (and never the token), and is not retried.
func TestCloudflareWrongToken(t *testing.T) {
	t.Parallel()
	const wrong = "wrong-token-value-1234"
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{Token: wrong})
	_, err := b.cf.Create(testCtx(t), sandbox.Spec{ID: "auth"})
	require.ErrorIs(t, err, sandbox.ErrInvalid)
	require.False(t, sandbox.Retryable(err))
	require.Contains(t, err.Error(), "bearer token")
	require.NotContains(t, err.Error(), wrong)
	require.Equal(t, 1, b.fake.Unauthorized())
	require.Zero(t, b.fake.Creates())
}

// TestCloudflareTokenNeverReachesSandbox runs a child that prints its
// environment: every request was authenticated, and neither the bridge
// token nor secret-looking names reach the process.
func TestCloudflareTokenNeverReachesSandbox(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	token := b.fake.Token()
	sb := b.sandbox(t, map[string]string{
		"PLAIN_SETTING":     "kept",
		"SNEAKY":            token,
		"GITHUB_TOKEN":      "gh-secret",
		"ANTHROPIC_API_KEY": "sk-secret",
	})
	out, st := runCF(t, sb, "env", sandbox.ProcSpec{Env: map[string]string{
		"EMBEDS_TOKEN":        "x" + token + "y",
		"DB_PASSWORD":         "pw",
		"FLEET_CF_BRIDGE_URL": "http://bridge",
		"PROC_SETTING":        "kept too",
	}}, "env")
	require.Equal(t, 0, st.Code)
	var env map[string]string
	require.NoError(t, json.Unmarshal([]byte(out), &env))
	require.Equal(t, "kept", env["PLAIN_SETTING"])
	require.Equal(t, "kept too", env["PROC_SETTING"])
	for _, name := range []string{"SNEAKY", "GITHUB_TOKEN", "ANTHROPIC_API_KEY", "EMBEDS_TOKEN", "DB_PASSWORD", "FLEET_CF_BRIDGE_URL"} {
		require.NotContains(t, env, name)
	}
	for k, v := range env {
		require.NotContains(t, v, token, "the bridge token reached the child as %s", k)
	}
	require.NotContains(t, strings.Join(b.fake.ProcEnv(sb.ID(), "env"), "\n"), token)
	require.Zero(t, b.fake.Unauthorized(), "every request carried the bearer token")
}

// runCF runs steps as process id in sb and returns stdout and the status.
func runCF(t *testing.T, sb sandbox.Sandbox, id string, spec sandbox.ProcSpec, steps ...string) (string, sandbox.ExitStatus) {
	t.Helper()
	spec.ID = id
	spec.Argv = sandboxtest.ChildArgv(steps...)
	p, err := sb.Start(testCtx(t), spec)
	require.NoError(t, err)
	out := recvRead(t, readAllAsync(p.Stdout()))
	require.NoError(t, out.err)
	st, err := p.Wait(testCtx(t))
	require.NoError(t, err)
	return string(out.b), st
}

// TestCloudflareNoExitEventIsNeverSuccess: streams that end, fail or hang
// without an exit event make Wait and Stdout fail with ErrUnavailable,
// after bounded re-attachment, even though the process exited 0.
func TestCloudflareNoExitEventIsNeverSuccess(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		mode  bridgefake.ExitMode
		pings bool
	}{
		{"EndsWithoutExit", bridgefake.ExitOmit, true},
		{"SilentWithoutPings", bridgefake.ExitHang, false},
		{"ErrorEvent", bridgefake.ExitError, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupCloudflare(t, bridgefake.Options{PingInterval: 20 * time.Millisecond}, sandbox.CloudflareConfig{
				PingTimeout:   300 * time.Millisecond,
				StreamRetries: 3,
			})
			b.fake.SetExitMode(tc.mode)
			b.fake.SetPings(tc.pings)
			sb := b.sandbox(t, nil)
			p, err := sb.Start(testCtx(t), sandbox.ProcSpec{ID: "quiet", Argv: sandboxtest.ChildArgv("echo hi", "exit 0")})
			require.NoError(t, err)
			out := recvRead(t, readAllAsync(p.Stdout()))
			require.ErrorIs(t, out.err, sandbox.ErrUnavailable, "stdout must not end with a clean EOF")
			require.Equal(t, "hi\n", string(out.b), "bytes delivered before the failure")
			st, err := p.Wait(testCtx(t))
			require.ErrorIs(t, err, sandbox.ErrUnavailable)
			require.True(t, sandbox.Retryable(err))
			require.NotEqual(t, 0, st.Code, "never reported as success")
			if tc.mode == bridgefake.ExitError {
				require.Equal(t, 1, b.fake.StreamConnects("quiet"), "an error event is final")
			} else {
				// StreamRetries attempts in a row without progress; one more
				// if a first attempt timed out before the output came.
				connects := b.fake.StreamConnects("quiet")
				require.GreaterOrEqual(t, connects, 3, "re-attached before giving up")
				require.LessOrEqual(t, connects, 4, "bounded re-attachment")
			}
		})
	}
}

// TestCloudflareHangingStreamWithPings: a stream that keeps pinging but
// never sends exit is neither mistaken for an end nor given up as dead:
// Wait returns only with its ctx. (Without the pings, two silent periods of
// PingTimeout would make it fail with ErrUnavailable well before that.)
func TestCloudflareHangingStreamWithPings(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{PingInterval: 10 * time.Millisecond}, sandbox.CloudflareConfig{
		PingTimeout:   500 * time.Millisecond,
		StreamRetries: 2,
	})
	b.fake.SetExitMode(bridgefake.ExitHang)
	sb := b.sandbox(t, nil)
	p, err := sb.Start(testCtx(t), sandbox.ProcSpec{ID: "hang", Argv: sandboxtest.ChildArgv("exit 0")})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(testCtx(t), 2*time.Second)
	defer cancel()
	_, err = p.Wait(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestCloudflareProcessLost: the stream ends without exit and the bridge no
// longer knows the sandbox: Wait fails at once with ErrUnavailable.
func TestCloudflareProcessLost(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{StreamRetries: 50})
	b.fake.SetExitMode(bridgefake.ExitOmit)
	sb := b.sandbox(t, nil)
	p, err := sb.Start(testCtx(t), sandbox.ProcSpec{ID: "lost", Argv: sandboxtest.ChildArgv("echo up", "sleep 1h")})
	require.NoError(t, err)
	br := bufio.NewReader(p.Stdout())
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "up\n", line)

	deleteBehindBack(t, b, sb.ID())

	_, err = p.Wait(testCtx(t))
	require.ErrorIs(t, err, sandbox.ErrUnavailable)
	require.Contains(t, err.Error(), "no longer knows the process")
	require.NotErrorIs(t, err, sandbox.ErrNotFound)
	require.Less(t, b.fake.StreamConnects("lost"), 50, "gave up without exhausting the retries")
}

// TestCloudflareSandboxVanished: once the bridge no longer knows the
// sandbox, calls fail with ErrUnavailable (not ErrNotFound: no file is
// "missing").
func TestCloudflareSandboxVanished(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	sb := b.sandbox(t, nil)
	require.NoError(t, sb.WriteFile(testCtx(t), "f", []byte("x")))
	deleteBehindBack(t, b, sb.ID())

	_, err := sb.ReadFile(testCtx(t), "f")
	require.ErrorIs(t, err, sandbox.ErrUnavailable)
	require.NotErrorIs(t, err, sandbox.ErrNotFound)
	require.ErrorIs(t, sb.WriteFile(testCtx(t), "f", []byte("x")), sandbox.ErrUnavailable)
	_, err = sb.Start(testCtx(t), sandbox.ProcSpec{ID: "p", Argv: sandboxtest.ChildArgv("exit 0")})
	require.ErrorIs(t, err, sandbox.ErrUnavailable)
}

// deleteBehindBack deletes a sandbox directly on the bridge.
func deleteBehindBack(t *testing.T, b *cfBundle, id string) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodDelete, b.fake.URL()+"/v1/sb/"+id, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.fake.Token())
	resp, err := b.fake.Client().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
}

// TestCloudflareKillOnStartContextCancel: cancelling the ctx given to Start
// kills the process.
func TestCloudflareKillOnStartContextCancel(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	sb := b.sandbox(t, nil)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	p, err := sb.Start(ctx, sandbox.ProcSpec{ID: "victim", Argv: sandboxtest.ChildArgv("ignore-sigterm", "echo up", "sleep 1h")})
	require.NoError(t, err)
	br := bufio.NewReader(p.Stdout())
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "up\n", line)

	cancel()
	rest := recvRead(t, readAllAsync(br))
	require.NoError(t, rest.err)
	st, err := p.Wait(testCtx(t))
	require.NoError(t, err)
	require.Equal(t, sandbox.ExitStatus{Code: -1, Signal: "SIGKILL"}, st)
	require.Equal(t, []string{"SIGKILL"}, b.fake.Kills("victim"))
}

// TestCloudflareStopSignals: Stop sends SIGTERM, then SIGKILL after the
// grace period to a process that ignores SIGTERM.
func TestCloudflareStopSignals(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	sb := b.sandbox(t, nil)
	p, err := sb.Start(testCtx(t), sandbox.ProcSpec{ID: "stubborn", Argv: sandboxtest.ChildArgv("ignore-sigterm", "echo up", "sleep 1h")})
	require.NoError(t, err)
	br := bufio.NewReader(p.Stdout())
	_, err = br.ReadString('\n')
	require.NoError(t, err)
	require.NoError(t, p.Stop(testCtx(t), 100*time.Millisecond))
	require.NoError(t, recvRead(t, readAllAsync(br)).err)
	st, err := p.Wait(testCtx(t))
	require.NoError(t, err)
	require.Equal(t, "SIGKILL", st.Signal)
	require.Equal(t, []string{"SIGTERM", "SIGKILL"}, b.fake.Kills("stubborn"))
	require.ErrorIs(t, p.Stop(testCtx(t), time.Second), sandbox.ErrExited)
}

// TestCloudflareStopCtxEndsDuringGrace: a Stop whose ctx ends before the
// grace period still leaves the process killed.
func TestCloudflareStopCtxEndsDuringGrace(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	sb := b.sandbox(t, nil)
	p, err := sb.Start(testCtx(t), sandbox.ProcSpec{ID: "stubborn", Argv: sandboxtest.ChildArgv("ignore-sigterm", "echo up", "sleep 1h")})
	require.NoError(t, err)
	br := bufio.NewReader(p.Stdout())
	_, err = br.ReadString('\n')
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, p.Stop(ctx, time.Hour), context.DeadlineExceeded)
	require.NoError(t, recvRead(t, readAllAsync(br)).err)
	st, err := p.Wait(testCtx(t))
	require.NoError(t, err)
	require.Equal(t, "SIGKILL", st.Signal)
	require.Equal(t, []string{"SIGTERM", "SIGKILL"}, b.fake.Kills("stubborn"))
}

// TestCloudflareStartIdempotent: starting the same process ID twice with the
// same spec re-attaches to the one process (a retried start is safe); a
// different spec under the same ID is ErrInvalid.
func TestCloudflareStartIdempotent(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	sb := b.sandbox(t, nil)
	spec := sandbox.ProcSpec{ID: "once", Argv: sandboxtest.ChildArgv("echo only once", "sleep 100ms"), Stdin: []byte("in")}
	p1, err := sb.Start(testCtx(t), spec)
	require.NoError(t, err)
	p2, err := sb.Start(testCtx(t), spec)
	require.NoError(t, err)
	for _, p := range []sandbox.Process{p1, p2} {
		out := recvRead(t, readAllAsync(p.Stdout()))
		require.NoError(t, out.err)
		require.Equal(t, "only once\n", string(out.b))
		st, err := p.Wait(testCtx(t))
		require.NoError(t, err)
		require.Equal(t, 0, st.Code)
	}
	require.Equal(t, 2, b.fake.Starts("once"))
	require.Equal(t, 1, b.fake.Launches("once"))

	spec.Argv = sandboxtest.ChildArgv("echo something else")
	_, err = sb.Start(testCtx(t), spec)
	require.ErrorIs(t, err, sandbox.ErrInvalid)
	require.False(t, sandbox.Retryable(err))
}

// TestCloudflareStdinGoesThroughAFile: the prompt is written to a workspace
// file and never appears in argv.
func TestCloudflareStdinGoesThroughAFile(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	sb := b.sandbox(t, nil)
	prompt := []byte("a prompt with 'quotes' and $(shell) `chars`\n")
	out, st := runCF(t, sb, "stdin", sandbox.ProcSpec{Stdin: prompt}, "stdin-echo")
	require.Equal(t, 0, st.Code)
	require.Equal(t, string(prompt), out)
	got, err := sb.ReadFile(testCtx(t), ".fleet/stdin-stdin")
	require.NoError(t, err)
	require.Equal(t, prompt, got)
}

// TestCloudflareFileErrors maps file answers to sentinels.
func TestCloudflareFileErrors(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	sb := b.sandbox(t, nil)
	ctx := testCtx(t)
	_, err := sb.ReadFile(ctx, "missing")
	require.ErrorIs(t, err, sandbox.ErrNotFound)
	for _, p := range []string{"../x", "/abs", "a/../../x", "", "a\\b"} {
		require.ErrorIs(t, sb.WriteFile(ctx, p, []byte("x")), sandbox.ErrInvalid, p)
	}
	require.ErrorIs(t, sb.WriteFile(ctx, "big", make([]byte, 32<<20+1)), sandbox.ErrInvalid)
	require.NoError(t, sb.Destroy(ctx))
	require.ErrorIs(t, sb.WriteFile(ctx, "late", []byte("x")), sandbox.ErrClosed)
	_, err = sb.ReadFile(ctx, "late")
	require.ErrorIs(t, err, sandbox.ErrClosed)
}

// TestCloudflareUnreachableBridge: transport failures are ErrUnavailable.
func TestCloudflareUnreachableBridge(t *testing.T) {
	t.Parallel()
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{ReadyTimeout: 200 * time.Millisecond})
	b.fake.Close() // the address now refuses connections
	_, err := b.cf.Create(testCtx(t), sandbox.Spec{ID: "gone"})
	require.ErrorIs(t, err, sandbox.ErrUnavailable)
	require.True(t, sandbox.Retryable(err))
}

// TestCloudflareConfigValidation rejects bad configs with ErrInvalid.
func TestCloudflareConfigValidation(t *testing.T) {
	t.Parallel()
	ok := sandbox.CloudflareConfig{BaseURL: "https://bridge.example", Token: "t0ken"}
	for name, mut := range map[string]func(*sandbox.CloudflareConfig){
		"no URL":         func(c *sandbox.CloudflareConfig) { c.BaseURL = "" },
		"not http":       func(c *sandbox.CloudflareConfig) { c.BaseURL = "ftp://x" },
		"no host":        func(c *sandbox.CloudflareConfig) { c.BaseURL = "https://" },
		"query":          func(c *sandbox.CloudflareConfig) { c.BaseURL = "https://x/?a=b" },
		"no token":       func(c *sandbox.CloudflareConfig) { c.Token = "" },
		"token newline":  func(c *sandbox.CloudflareConfig) { c.Token = "a\nb" },
		"client timeout": func(c *sandbox.CloudflareConfig) { c.HTTPClient = &http.Client{Timeout: time.Second} },
		"negative ping":  func(c *sandbox.CloudflareConfig) { c.PingTimeout = -1 },
		"tiny sleep":     func(c *sandbox.CloudflareConfig) { c.SleepAfter = time.Millisecond },
		"negative tries": func(c *sandbox.CloudflareConfig) { c.Attempts = -1 },
		"backoff min>max": func(c *sandbox.CloudflareConfig) {
			c.Backoff = sandbox.Backoff{Initial: time.Second, Max: time.Millisecond}
		},
	} {
		cfg := ok
		mut(&cfg)
		_, err := sandbox.NewCloudflare(cfg)
		require.ErrorIs(t, err, sandbox.ErrInvalid, name)
	}
	c, err := sandbox.NewCloudflare(ok)
	require.NoError(t, err)
	require.Equal(t, "cloudflare", c.Name())
	_, err = c.Create(testCtx(t), sandbox.Spec{ID: "bad/id"})
	require.ErrorIs(t, err, sandbox.ErrInvalid)
}

// TestDeniedEnvName covers the Cloudflare deny-list.
func TestDeniedEnvName(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"FLEET_X", "nats_url", "AWS_REGION", "CLOUDFLARE_API_TOKEN", "CF_X", "R2_KEY", "CLAUDECODE",
		"GITHUB_TOKEN", "x_secret", "DB_PASSWORD", "GOOGLE_APPLICATION_CREDENTIALS", "ANTHROPIC_API_KEY", "AWS_SECRET_KEY"} {
		require.True(t, sandbox.DeniedEnvName(n), n)
	}
	for _, n := range []string{"PATH", "HOME", "LANG", "MY_SETTING", "TOKENIZER", "IS_SANDBOX"} {
		require.False(t, sandbox.DeniedEnvName(n), n)
	}
}
