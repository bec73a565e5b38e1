package dashboard

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/discovery"
	"github.com/agentfleet/agentfleet/internal/fleetmetrics"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/httpapi"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

func TestMain(m *testing.M) { fleettest.MainNoLeaks(m) }

const wait = 2 * time.Minute

type testBundle struct {
	f   *fleettest.Fleet
	w   *fleettest.Worker
	srv *httptest.Server
}

func setup(t *testing.T, token string) *testBundle {
	t.Helper()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, w.W)
	svc, err := discovery.ServeWorker(w.NC, f.Names, discovery.Worker{ID: w.W.ID(), Info: w.W.Info, Drain: func() {}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })
	q, err := fleetmetrics.New(f.Client, 2)
	require.NoError(t, err)
	h, err := New(Config{Client: f.Client, Queue: q, Token: token, Objects: f.Objects, Status: f.Status, PageSize: 2, Logger: &f.Logger})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testBundle{f: f, w: w, srv: srv}
}

func submit(t *testing.T, f *fleettest.Fleet, id, prompt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	r, err := f.Client.Submit(ctx, protocol.Job{ID: id, Prompt: prompt})
	require.NoError(t, err)
	require.Nil(t, r.Error)
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// A workspace job's stored diff is served as text behind the token, and a
// query with none, or a bad id, gets a clear 404 or 400.
func TestWorkspaceDiff(t *testing.T) {
	t.Parallel()
	b := setup(t, "s3cret")
	patch := []byte("diff --git a/a.go b/a.go\n--- a/a.go\n+++ b/a.go\n@@ -1 +1 @@\n-old\n+new\n")
	require.NoError(t, b.f.Objects.Put(context.Background(), storage.DiffKey("default", "wd-1"), patch))
	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, b.srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := (&http.Client{CheckRedirect: noRedirect}).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	code, body := get("/q/default/wd-1/diff", "s3cret")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, string(patch), body)
	code, _ = get("/q/default/wd-1/diff", "")
	require.NotEqual(t, http.StatusOK, code, "the diff needs the token")
	code, body = get("/q/default/none/diff", "s3cret")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, "no workspace diff")
	code, _ = get("/q/default/bad..id/diff", "s3cret")
	require.Equal(t, http.StatusBadRequest, code)
}

// Without the token every page and action is refused; with it (header or
// the /login cookie) they are served. Without a token only loopback
// clients are served.
func TestAccess(t *testing.T) {
	t.Parallel()
	b := setup(t, "s3cret")
	submit(t, b.f, "acc-1", "/standin sleep=1h")
	c := &http.Client{CheckRedirect: noRedirect}
	// A browser without credentials is sent to sign in.
	req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/", nil)
	req.Header.Set("Accept", "text/html,application/xhtml+xml,*/*;q=0.8")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/login", resp.Header.Get("Location"))
	for _, u := range []string{"/q/default/acc-1/events"} {
		resp, err = c.Get(b.srv.URL + u)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, u)
	}
	resp, err = c.Post(b.srv.URL+"/q/default/acc-1/cancel", "application/x-www-form-urlencoded", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	req, _ = http.NewRequest(http.MethodGet, b.srv.URL+"/queries", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err = c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	// A cross-site form post is refused even with the cookie.
	req, _ = http.NewRequest(http.MethodPost, b.srv.URL+"/q/default/acc-1/cancel", nil)
	req.AddCookie(&http.Cookie{Name: cookieName, Value: "s3cret"})
	req.Header.Set("Origin", "https://evil.example")
	resp, err = c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	st, err := b.f.Client.Status(context.Background(), protocol.QueryRef{ID: "acc-1"})
	require.NoError(t, err)
	require.False(t, st.Status.State.Terminal(), "nothing cancelled it")

	// No token: loopback only.
	h := b.srv.Config.Handler.(*Handler)
	open := *h
	open.cfg.Token = ""
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/queries", nil)
	r.RemoteAddr = "10.1.2.3:4567"
	open.ServeHTTP(rec, r)
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	rec = httptest.NewRecorder()
	r.RemoteAddr = "127.0.0.1:4567"
	open.ServeHTTP(rec, r)
	require.Equal(t, http.StatusOK, rec.Code)
	require.NoError(t, b.f.NC.Publish(b.f.Names.QueryCtl("default", "acc-1"), []byte(`{"op":"cancel"}`)))
}

// A program is never sent to the sign-in page: a wrong bearer token (even
// from a client that accepts HTML), or no credentials from a client that
// does not accept HTML, gets 401 with the JSON error of the HTTP API, on
// the dashboard's routes as on /v1. Before, a wrong token got 303 to /login.
func TestWrongTokenIs401JSONNotASignInRedirect(t *testing.T) {
	t.Parallel()
	b := setup(t, "s3cret")
	api, err := httpapi.New(httpapi.Config{Client: b.f.Client, Status: b.f.Status, Objects: b.f.Objects, Auth: httpapi.Auth{OperatorToken: "s3cret"}})
	require.NoError(t, err)
	srv := httptest.NewServer(httpapi.Mount(api, b.srv.Config.Handler))
	t.Cleanup(srv.Close)
	c := &http.Client{CheckRedirect: noRedirect}
	for _, tc := range []struct{ path, auth, accept string }{
		{"/", "Bearer wrong", "text/html"},
		{"/queries", "Bearer wrong", ""},
		{"/q/default/x", "Bearer wrong", "application/json"},
		{"/fleet.json", "Bearer wrong", "*/*"},
		{"/q/default/x/events", "Bearer wrong", "text/event-stream"},
		{"/queries", "", "application/json"},
		{"/", "", "*/*"},
		{"/v1/queries", "Bearer wrong", "text/html"},
		{"/v1/queries", "", "text/html"},
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		derr := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%+v", tc)
		require.NoError(t, derr, "%+v: a JSON error body", tc)
		require.Equal(t, "unauthorized", body.Error.Code, "%+v", tc)
		require.NotEmpty(t, body.Error.Message, "%+v", tc)
		require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Bearer", "%+v", tc)
	}
}

// The query page's stream resumes: each line carries its Fleet-Seq as
// the event id, and a browser that connects again with Last-Event-ID gets
// only the lines after it. Before, a dropped stream (a proxy's idle
// timeout while a session waits for an approval) was replayed from the
// start, and the page showed every line, the permission request
// included, twice.
func TestEventsResumeAfterLastEventID(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	submit(t, b.f, "resume-1", "/standin lines=5")
	r := b.f.Follow("default", "resume-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	total := len(r.Lines)
	require.Greater(t, total, 4)
	ids := func(last string) []uint64 {
		req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/q/default/resume-1/events", nil)
		if last != "" {
			req.Header.Set("Last-Event-ID", last)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var out []uint64
		for _, l := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(l, "id: "); ok {
				n, err := strconv.ParseUint(v, 10, 64)
				require.NoError(t, err)
				out = append(out, n)
			}
		}
		require.Equal(t, strings.Count(string(body), "event: line\n"), len(out), "every line has its id")
		return out
	}
	all := ids("")
	require.Len(t, all, total)
	require.Equal(t, uint64(1), all[0])
	rest := ids("3")
	require.Len(t, rest, total-3, "only the lines after the last one the browser got")
	require.Equal(t, uint64(4), rest[0])
}

// browser starts headless Chromium for t. Chromium is required in CI
// (.ci/run installs it); elsewhere its absence skips the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	var exe string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			exe = p
			break
		}
	}
	if exe == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed; .ci/run installs it (apt-get install chromium)")
		}
		t.Skip("chromium is not installed (apt-get install chromium); the dashboard's browser test needs it")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, tcancel := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(func() { tcancel(); cancel(); acancel() })
	require.NoError(t, chromedp.Run(ctx), "starting chromium")
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var png []byte
		sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
		defer scancel()
		if err := chromedp.Run(sctx, chromedp.FullScreenshot(&png, 90)); err == nil {
			p := filepath.Join(t.TempDir(), "failure.png")
			if os.WriteFile(p, png, 0o644) == nil {
				t.Logf("screenshot: %s", p)
			}
		}
	})
	return ctx
}

// pageText is the text of the element with the given id, read in one step
// inside the page, or "" while the page is between loads or lacks it.
func pageText(ctx context.Context, id string) string {
	var s string
	js := `(function(){var e=document.getElementById(` + strconv.Quote(id) + `);return e?e.innerText:""})()`
	if err := chromedp.Run(ctx, chromedp.Evaluate(js, &s)); err != nil {
		return ""
	}
	return s
}

// The dashboard in a real browser: sign in, the fleet page, a running
// query's transcript growing live without a reload, the query list, and a
// cancel from the UI that ends the run; no console errors on any page.
func TestBrowser(t *testing.T) {
	t.Parallel()
	b := setup(t, "s3cret")
	ctx := browser(t)
	var (
		mu       sync.Mutex
		problems []string
	)
	chromedp.ListenTarget(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+ev.ExceptionDetails.Text)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.APITypeError {
				problems = append(problems, "console.error")
			}
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.LevelError {
				problems = append(problems, "log: "+ev.Entry.Text+" "+ev.Entry.URL)
			}
		}
	})
	submit(t, b.f, "ui-1", "/standin lines=200 delay=250ms")
	var workers string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/q/default/ui-1"),
		chromedp.WaitVisible("#token", chromedp.ByID), // redirected to the login
		chromedp.SendKeys("#token", "s3cret", chromedp.ByID),
		chromedp.Click("#signin", chromedp.ByID),
		chromedp.WaitVisible("#workers", chromedp.ByID),
	))
	// The fleet page reloads itself every 5 s, so its table is read in one
	// step inside the page, never by a node id that a reload can retire.
	fleettest.Eventually(t, wait, func() bool {
		workers = pageText(ctx, "workers")
		return strings.Contains(workers, b.w.W.ID()) && strings.Contains(workers, "pulling")
	}, "the fleet page lists the worker pulling")

	count := func() int {
		var n int
		require.NoError(t, chromedp.Run(ctx, chromedp.Evaluate(`document.querySelectorAll("#transcript .line").length`, &n)))
		return n
	}
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/q/default/ui-1"),
		chromedp.WaitVisible("#transcript", chromedp.ByID),
		chromedp.Evaluate(`window.fleetMarker = "same page"`, nil),
	))
	fleettest.Eventually(t, wait, func() bool { return count() >= 3 }, "the transcript shows lines")
	n1 := count()
	fleettest.Eventually(t, wait, func() bool { return count() > n1+2 }, "the transcript grows")
	var marker, timeline string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Evaluate(`window.fleetMarker`, &marker),
		chromedp.Text("#timeline", &timeline, chromedp.ByID),
	))
	require.Equal(t, "same page", marker, "it grew without a reload")
	require.Contains(t, timeline, "running · attempt 1")

	var list string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/queries?state=running"),
		chromedp.Text("#queries", &list, chromedp.ByID),
	))
	require.Contains(t, list, "default/ui-1")

	// Cancel from the UI ends the run.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/q/default/ui-1"),
		chromedp.WaitVisible("#cancel", chromedp.ByID),
		chromedp.Click("#cancel", chromedp.ByID),
		chromedp.WaitVisible("#notice", chromedp.ByID),
	))
	fleettest.Eventually(t, wait, func() bool {
		return strings.TrimSpace(pageText(ctx, "state")) == "cancelled"
	}, "the page shows the run cancelled")
	st, err := b.f.Client.Status(context.Background(), protocol.QueryRef{ID: "ui-1"})
	require.NoError(t, err)
	require.Equal(t, protocol.StateCancelled, st.Status.State)
	// The state may be the server's render of the page the cancel led
	// back to, before its feed replayed the transcript: wait for that too.
	fleettest.Eventually(t, wait, func() bool {
		return strings.Contains(pageText(ctx, "transcript"), "✗ cancelled")
	}, "the transcript ends cancelled")

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, problems, "console errors")
}

// TestBrowserShowsTheAnswerAndEachStateOnce: the query page shows the
// result's text (the answer), and a state reported twice in a row once.
func TestBrowserShowsTheAnswerAndEachStateOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	ctx := browser(t)
	submit(t, b.f, "ans-1", "what is the answer")
	b.f.Follow("default", "ans-1", wait)
	var transcript, timeline string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/q/default/ans-1"),
		chromedp.WaitVisible(".answer", chromedp.ByQuery),
		chromedp.Text("#transcript", &transcript, chromedp.ByID),
		chromedp.Text("#timeline", &timeline, chromedp.ByID),
	))
	require.Contains(t, transcript, "Answer: [stand-in agent]")
	screenshot(t, ctx, "answer")
	require.Equal(t, 1, strings.Count(timeline, "running"), timeline)
	require.Equal(t, 1, strings.Count(timeline, "succeeded"), timeline)
}

// The run page says what started a run: a schedule, an inbound webhook,
// a GitHub event (its link made safe), or a producer.
func TestRunPageShowsItsTrigger(t *testing.T) {
	t.Parallel()
	b := setup(t, "s3cret")
	f := b.f
	jobs := map[string]string{
		"by-producer": `{"id":"by-producer","prompt":"p"}`,
		"by-schedule": `{"id":"by-schedule","prompt":"p","trigger":{"kind":"schedule","name":"nightly","fire_at":"2026-12-08T01:00:00Z"}}`,
		"by-webhook":  `{"id":"by-webhook","prompt":"p","trigger":{"kind":"webhook","name":"deploy","delivery":"msg_1"}}`,
		"by-github":   `{"id":"by-github","prompt":"p","trigger":{"kind":"github","event":"issue_comment","url":"javascript:alert(1)"}}`,
	}
	for id, body := range jobs {
		f.PublishJob("default", []byte(body), nil)
		require.Equal(t, protocol.StateSucceeded, f.Follow("default", id, wait).Final.State)
	}
	page := func(id string) string {
		var body string
		fleettest.Eventually(t, wait, func() bool { // the status index lags the run's end
			req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/q/default/"+id, nil)
			req.Header.Set("Authorization", "Bearer s3cret")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			body = string(raw)
			return resp.StatusCode == http.StatusOK && strings.Contains(body, `id="trigger"`)
		}, "the run page of "+id)
		return body
	}
	require.Contains(t, page("by-producer"), "submitted by a producer")
	require.Contains(t, page("by-schedule"), "started by schedule nightly at 2026-12-08 01:00:00Z")
	require.Contains(t, page("by-webhook"), "started by inbound webhook deploy (delivery msg_1)")
	gh := page("by-github")
	require.Contains(t, gh, "started by GitHub issue_comment")
	require.NotContains(t, gh, `href="javascript:`)
}

// The run page shows a traced run's trace id, and nothing of the kind
// for a run without one.
func TestRunPageShowsItsTraceID(t *testing.T) {
	t.Parallel()
	b := setup(t, "s3cret")
	f := b.f
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	f.PublishJob("default", []byte(`{"id":"traced","prompt":"p"}`), map[string]string{protocol.HeaderMsgID: "default.traced",
		"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"})
	f.PublishJob("default", []byte(`{"id":"untraced","prompt":"p"}`), nil)
	for _, id := range []string{"traced", "untraced"} {
		require.Equal(t, protocol.StateSucceeded, f.Follow("default", id, wait).Final.State)
	}
	page := func(id string) string {
		var body string
		fleettest.Eventually(t, wait, func() bool { // the status index lags the run's end
			req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/q/default/"+id, nil)
			req.Header.Set("Authorization", "Bearer s3cret")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			body = string(raw)
			return resp.StatusCode == http.StatusOK && strings.Contains(body, "succeeded")
		}, "the run page of "+id)
		return body
	}
	require.Contains(t, page("traced"), `trace <code id="trace">`+traceID+`</code>`)
	require.NotContains(t, page("untraced"), `id="trace"`)
}
