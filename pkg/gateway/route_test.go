package gateway_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/gateway"
)

// upstreamPath is what may reach the upstream: the allow-list's paths.
var upstreamPath = regexp.MustCompile(`^/v1/(messages|messages/count_tokens|models|models/[a-z0-9]+([._-][a-z0-9]+)*)$`)

// recorder is an upstream that records every request and fails the test
// when one arrives whose path is not a route of the allow-list.
type recorder struct {
	srv  *httptest.Server
	mu   sync.Mutex
	got  []*http.Request
	uris []string
}

// newRecorder serves the upstream; base is the upstream's base path.
func newRecorder(t *testing.T, base string) *recorder {
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.got = append(rec.got, r)
		rec.uris = append(rec.uris, r.RequestURI)
		rec.mu.Unlock()
		path, _, _ := strings.Cut(r.RequestURI, "?")
		if p, ok := strings.CutPrefix(path, base); !ok || !upstreamPath.MatchString(p) {
			t.Errorf("the upstream was sent %s %q, not a route of the allow-list (credential %q)", r.Method, r.RequestURI, r.Header.Get("X-Api-Key"))
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data":[]}`)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) requests() ([]*http.Request, []string) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]*http.Request(nil), rec.got...), append([]string(nil), rec.uris...)
}

// rawRequest sends method and target byte for byte (no client library to
// clean the path) and returns the answer.
func rawRequest(t *testing.T, gwURL, method, target string, header map[string]string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	var b strings.Builder
	b.WriteString(method + " " + target + " HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n")
	for k, v := range header {
		b.WriteString(k + ": " + v + "\r\n")
	}
	if method == http.MethodPost {
		b.WriteString("Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	} else {
		b.WriteString("\r\n")
	}
	_, err = io.WriteString(conn, b.String())
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestPathTraversalIsNeverForwarded sends the ways of writing a path
// outside the Messages API (dot segments in every encoding, encoded
// slashes, backslashes, ';', control characters, an absolute target):
// each is refused with an Anthropic-shaped 400 or 404, and the upstream,
// which fails the test on any path not of the allow-list, sees none.
func TestPathTraversalIsNeverForwarded(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, "")
	b := setup(t, nil, func(c *gateway.Config) { c.Upstream = rec.srv.URL })
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	h := map[string]string{"X-Api-Key": token}
	for _, tc := range []struct{ method, target string }{
		{"GET", "/v1/models/../files"},
		{"GET", "/v1/models/%2e%2e/files"},
		{"GET", "/v1/models/%2E%2E/files"},
		{"GET", "/v1/models/.%2e/files"},
		{"GET", "/v1/models/%2e./files"},
		{"GET", "/v1/models/..%2ffiles"},
		{"GET", "/v1/models/..%2Ffiles"},
		{"GET", "/v1/models/%2e%2e%2ffiles"},
		{"GET", "/v1/models/%252e%252e/files"},
		{"GET", "/v1/models/%252E%252E%252Ffiles"},
		{"GET", "/v1/models/%25252e%25252e/files"},
		{"GET", "/v1/models/..%252ffiles"},
		{"GET", `/v1/models/..\files`},
		{"GET", "/v1/models/..%5cfiles"},
		{"GET", "/v1/models/..%5Cfiles"},
		{"GET", "/v1/models/..;/files"},
		{"GET", "/v1/models/claude;x=..%2f"},
		{"GET", "/v1/models/%3b/files"},
		{"GET", "/v1/models/%00"},
		{"GET", "/v1/models/a%0d%0aX-Api-Key:%20x"},
		{"GET", "/v1/models/%c0%ae%c0%ae/files"},
		{"GET", "/v1/models/claude-x/../../files"},
		{"GET", "/v1/models/./claude-x"},
		{"GET", "/v1/models/"},
		{"GET", "//v1/models"},
		{"GET", "/v1//models"},
		{"GET", "/V1/MODELS"},
		{"GET", "/v1/models/CLAUDE"},
		{"GET", "/v1/models/a..b"},
		{"GET", "/v1/files"},
		{"GET", "/v1/messages/batches"},
		{"GET", "http://gateway/v1/files"},
		{"GET", "http://gateway/v1/models"},
		{"POST", "/v1/messages/../files"},
		{"POST", "/v1/messages/%2e%2e/files"},
		{"POST", "/v1/messages/./count_tokens"},
		{"POST", "/v1/messages/"},
		{"POST", "/v1/messages/batches"},
		{"POST", "/v1/models"},
		{"DELETE", "/v1/models/claude-x"},
		{"PUT", "/v1/messages"},
		{"GET", "/v1/messages"},
	} {
		status, body := rawRequest(t, b.gw.URL(), tc.method, tc.target, h)
		name := tc.method + " " + tc.target
		require.Contains(t, []int{http.StatusBadRequest, http.StatusNotFound}, status, "%s: %s", name, body)
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(body), &e) == nil && e.Type == "error" {
			require.Contains(t, []string{"invalid_request_error", "not_found_error"}, e.Error.Type, name)
			require.NotEmpty(t, e.Error.Message, name)
		} else {
			// net/http itself refused a target it cannot parse: it never
			// reached the gateway's handler.
			require.Equal(t, http.StatusBadRequest, status, "%s: %s", name, body)
		}
		require.NotContains(t, body, realKey, name)
	}
	_, uris := rec.requests()
	require.Empty(t, uris, "a refused request reached the upstream")
	require.Empty(t, b.events)
}

// TestForwardedRequestIsBuiltByTheGateway: what is forwarded is the
// route's path, the known query parameters re-encoded, the allowed headers
// and the worker's credential; the agent's own credential headers and
// everything else are dropped.
func TestForwardedRequestIsBuiltByTheGateway(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, "/base")
	b := setup(t, nil, func(c *gateway.Config) { c.Upstream = rec.srv.URL + "/base/" })
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	h := map[string]string{
		"Authorization": "Bearer " + token, "X-Api-Key": token, "Anthropic-Version": "2023-06-01",
		"Anthropic-Beta": "claude-code-20250219", "X-Stainless-Os": "Linux", "X-App": "cli",
		"User-Agent": "claude-cli/2", "Cookie": "session=agent", "X-Forwarded-For": "10.0.0.1",
		"Anthropic-Workspace-Id": "wrkspc_other", "Forwarded": "for=1.2.3.4", "X-Custom": "x",
		"Proxy-Authorization": "Basic eDp5",
	}
	for _, tc := range []struct{ method, target, want string }{
		{"POST", "/v1/messages?beta=true", "/base/v1/messages?beta=true"},
		{"POST", "/v1/messages?beta=true&beta=true", ""},
		{"POST", "/v1/messages?beta=yes", ""},
		{"POST", "/v1/messages?beta=true&path=../files&redirect=x", "/base/v1/messages?beta=true"},
		{"POST", "/v1/messages/count_tokens?beta=true", "/base/v1/messages/count_tokens?beta=true"},
		{"GET", "/v1/models?limit=5&after_id=claude-x&x=%2e%2e", "/base/v1/models?after_id=claude-x&limit=5"},
		{"GET", "/v1/models?limit=5000", ""},
		{"GET", "/v1/models?after_id=../files", ""},
		{"GET", "/v1/models/claude-sonnet-4-5-20250929", "/base/v1/models/claude-sonnet-4-5-20250929"},
		{"GET", "/v1/models/claude-3.5-x?x=1", "/base/v1/models/claude-3.5-x"},
	} {
		_, before := rec.requests()
		status, body := rawRequest(t, b.gw.URL(), tc.method, tc.target, h)
		_, after := rec.requests()
		if tc.want == "" {
			require.Equal(t, http.StatusBadRequest, status, "%s %s: %s", tc.method, tc.target, body)
			require.Contains(t, body, `"invalid_request_error"`)
			require.Len(t, after, len(before), "a refused query reached the upstream")
			continue
		}
		require.Equal(t, http.StatusOK, status, "%s %s: %s", tc.method, tc.target, body)
		require.Equal(t, []string{tc.want}, after[len(before):], tc.target)
	}
	reqs, _ := rec.requests()
	require.NotEmpty(t, reqs)
	for _, r := range reqs {
		require.Equal(t, realKey, r.Header.Get("X-Api-Key"))
		for _, gone := range []string{"Authorization", "Cookie", "X-Forwarded-For", "Anthropic-Workspace-Id", "Forwarded", "X-Custom", "Proxy-Authorization"} {
			require.Empty(t, r.Header.Values(gone), "%s reached the upstream", gone)
		}
		for k, want := range map[string]string{"Anthropic-Version": "2023-06-01", "Anthropic-Beta": "claude-code-20250219",
			"X-Stainless-Os": "Linux", "X-App": "cli", "User-Agent": "claude-cli/2"} {
			require.Equal(t, want, r.Header.Get(k), k)
		}
		for k, vs := range r.Header {
			for _, v := range vs {
				require.NotContains(t, v, token, "the run token reached the upstream in %s", k)
			}
		}
	}
}
