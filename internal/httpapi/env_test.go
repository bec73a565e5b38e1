package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/httpapi"
)

const wait = 2 * time.Minute

// env is a fleet (NATS, dispatcher, one worker with the stand-in agent)
// with the API served on loopback. Every request made through do is
// checked against the OpenAPI document (request and response), and the
// documented operations it reached are recorded.
type env struct {
	t      *testing.T
	f      *fleettest.Fleet
	srv    *httptest.Server
	router routers.Router

	mu   sync.Mutex
	seen map[string]bool // "METHOD path-template STATUS"
}

func newEnv(t *testing.T, auth httpapi.Authenticator) *env {
	t.Helper()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 4})
	fleettest.WaitReady(t, w.W)
	api, err := httpapi.New(httpapi.Config{Client: f.Client, Status: f.Status, Objects: f.Objects, Auth: auth, Logger: &f.Logger})
	require.NoError(t, err)
	srv := httptest.NewServer(httpapi.Mount(api, nil))
	t.Cleanup(srv.Close)
	doc, err := openapi3.NewLoader().LoadFromData(httpapi.OpenAPI)
	require.NoError(t, err)
	require.True(t, doc.IsOpenAPI31OrLater())
	require.NoError(t, doc.Validate(context.Background()), "the OpenAPI document is valid")
	doc.Servers = openapi3.Servers{{URL: srv.URL}}
	router, err := legacy.NewRouter(doc)
	require.NoError(t, err)
	return &env{t: t, f: f, srv: srv, router: router, seen: map[string]bool{}}
}

// reply is one answer, its body read.
type reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// do sends a request (body as JSON unless ctype says otherwise), checks it
// and its answer against the OpenAPI document, and returns the answer.
// Requests the document does not describe (a bad content type, an unknown
// field) are checked for their answer only: an error body.
func (e *env) do(method, path, token, ctype string, body []byte, hdr ...string) reply {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, bytes.NewReader(body))
	require.NoError(e.t, err)
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	e.check(req, body, resp, b)
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

func (e *env) check(req *http.Request, body []byte, resp *http.Response, b []byte) {
	e.t.Helper()
	route, params, err := e.router.FindRoute(req)
	require.NoError(e.t, err, "%s %s is a documented operation", req.Method, req.URL.Path)
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true, MultiError: true}
	req.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	if resp.StatusCode < 400 {
		require.NoError(e.t, reqErr, "a request the API accepted is valid by the document")
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		opts = &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true, ExcludeResponseBody: true}
		in.Options = opts
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body: io.NopCloser(bytes.NewReader(b)), Options: opts}
	require.NoError(e.t, openapi3filter.ValidateResponse(context.Background(), out),
		"%s %s answered %d %s: matches the document", req.Method, req.URL.Path, resp.StatusCode, b)
	e.mu.Lock()
	e.seen[req.Method+" "+route.Path+" "+http.StatusText(resp.StatusCode)] = true
	e.seen[req.Method+" "+route.Path] = true
	e.mu.Unlock()
}

// requireErr checks an error answer's status and code.
func requireErr(t *testing.T, r reply, status int, code string) {
	t.Helper()
	require.Equal(t, status, r.Status, "%s", r.Body)
	require.Contains(t, string(r.Body), `"code":"`+code+`"`)
}

// sseEvent is one Server-Sent Event.
type sseEvent struct {
	Name, ID string
	Data     []byte
}

// stream reads a query's events until the server ends the stream.
func (e *env) stream(path, token, lastID string) []sseEvent {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.URL+path, nil)
	require.NoError(e.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	require.Equal(e.t, http.StatusOK, resp.StatusCode)
	e.check(req, nil, resp, nil)
	evs, err := readSSE(resp.Body)
	require.NoError(e.t, err)
	return evs
}

// readSSE parses an event stream (comments skipped) until EOF.
func readSSE(r io.Reader) ([]sseEvent, error) {
	var out []sseEvent
	var cur sseEvent
	var data [][]byte
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.Name != "" || data != nil {
				cur.Data = bytes.Join(data, []byte("\n"))
				out = append(out, cur)
			}
			cur, data = sseEvent{}, nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event: "):
			cur.Name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			cur.ID = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, []byte(strings.TrimPrefix(line, "data: ")))
		default:
			return out, errors.New("unexpected SSE line: " + line)
		}
	}
	return out, sc.Err()
}

// streamUntil reads a query's events until the line with id stopAt, then
// drops the connection, as a client that lost it would.
func (e *env) streamUntil(path, stopAt string) []sseEvent {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.URL+path, nil)
	require.NoError(e.t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var raw bytes.Buffer
	for {
		line, err := br.ReadString('\n')
		require.NoError(e.t, err, "the stream ended before line %s", stopAt)
		raw.WriteString(line)
		if line != "\n" {
			continue
		}
		evs, err := readSSE(bytes.NewReader(raw.Bytes()))
		require.NoError(e.t, err)
		if len(evs) > 0 && evs[len(evs)-1].ID == stopAt {
			return evs
		}
	}
}
