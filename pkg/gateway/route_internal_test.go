package gateway

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// allowedUpstream is every upstream path a route may have.
var allowedUpstream = regexp.MustCompile(`^/v1/(messages|messages/count_tokens|models|models/[a-z0-9]+([._-][a-z0-9]+)*)$`)

// dotSegmentAfterDecoding reports whether any percent-decoding of p (to
// a fixed point) has a "." or ".." segment, or a backslash, which some
// servers take for a slash.
func dotSegmentAfterDecoding(p string) bool {
	for range 64 {
		for seg := range strings.SplitSeq(strings.ReplaceAll(p, `\`, "/"), "/") {
			if seg == "." || seg == ".." {
				return true
			}
		}
		next, err := url.PathUnescape(p)
		if err != nil || next == p {
			return false
		}
		p = next
	}
	return true
}

func TestMatchRoute(t *testing.T) {
	for _, tc := range []struct {
		method, target, path, query string
		metered                     bool
	}{
		{"POST", "/v1/messages", "/v1/messages", "", true},
		{"POST", "/v1/messages?beta=true", "/v1/messages", "beta=true", true},
		{"POST", "/v1/messages/count_tokens?beta=true&x=1", "/v1/messages/count_tokens", "beta=true", false},
		{"GET", "/v1/models?limit=20", "/v1/models", "limit=20", false},
		{"GET", "/v1/models/claude-opus-4-1-20250805", "/v1/models/claude-opus-4-1-20250805", "", false},
	} {
		r, ref := matchRoute(tc.method, tc.target)
		require.Nil(t, ref, tc.target)
		require.Equal(t, tc.path, r.path, tc.target)
		require.Equal(t, tc.query, r.query, tc.target)
		require.Equal(t, tc.metered, r.metered, tc.target)
	}
	for target, status := range map[string]int{
		"/v1/models/../files":       http.StatusBadRequest,
		"/v1/models/%2e%2e/files":   http.StatusBadRequest,
		"/v1/models/..%2ffiles":     http.StatusBadRequest,
		"/v1/models/%252e%252e/x":   http.StatusBadRequest,
		"/v1/models/%zz":            http.StatusBadRequest,
		`/v1/models/a\b`:            http.StatusBadRequest,
		"/v1/models/a;b":            http.StatusBadRequest,
		"/v1/models/a%09":           http.StatusBadRequest,
		"/v1/models/%252525252e%25": http.StatusBadRequest,
		"*":                         http.StatusBadRequest,
		"/v1/files":                 http.StatusNotFound,
		"/v1/models/Claude":         http.StatusNotFound,
		"/v1/models/a%2db":          http.StatusNotFound,
	} {
		_, ref := matchRoute(http.MethodGet, target)
		require.NotNil(t, ref, target)
		require.Equal(t, status, ref.status, target)
	}
}

// FuzzMatchRoute: an accepted target's path has no dot segment after any
// decoding, the upstream path is a route of the allow-list and is the
// target's path itself (no encoding), and the query holds only the
// route's known parameters.
func FuzzMatchRoute(f *testing.F) {
	for _, s := range []string{
		"/v1/messages?beta=true", "/v1/messages/count_tokens", "/v1/models?limit=5&after_id=a-b",
		"/v1/models/claude-sonnet-4-5", "/v1/models/../files", "/v1/models/%2e%2e/files",
		"/v1/models/..%2ffiles", "/v1/models/%252e%252e/files", `/v1/models/..\files`, "/v1/models/..;/files",
		"//v1/models", "/v1/models/", "/v1/models/a.b", "/v1/models/%61",
	} {
		f.Add("GET", s)
		f.Add("POST", s)
	}
	f.Fuzz(func(t *testing.T, method, target string) {
		r, ref := matchRoute(method, target)
		if ref != nil {
			if ref.status != http.StatusBadRequest && ref.status != http.StatusNotFound {
				t.Fatalf("refused %q with %d", target, ref.status)
			}
			return
		}
		rawPath, rawQuery, _ := strings.Cut(target, "?")
		if dotSegmentAfterDecoding(rawPath) {
			t.Fatalf("accepted %q, whose path has a dot segment after decoding", target)
		}
		if !allowedUpstream.MatchString(r.path) || r.path != rawPath || strings.ContainsAny(r.path, "%;\\") {
			t.Fatalf("accepted %q as upstream path %q", target, r.path)
		}
		if (r.name == routeMessages) != (method == http.MethodPost && r.path == "/v1/messages") || r.metered != (r.name == routeMessages) {
			t.Fatalf("accepted %s %q as %+v", method, target, r)
		}
		q, err := url.ParseQuery(r.query)
		if err != nil {
			t.Fatalf("query %q of %q does not parse: %v", r.query, target, err)
		}
		if r.query != q.Encode() {
			t.Fatalf("query %q is not re-encoded", r.query)
		}
		for k := range q {
			switch k {
			case "beta", "limit", "after_id", "before_id":
			default:
				t.Fatalf("query of %q passes %q (raw %q)", target, k, rawQuery)
			}
		}
	})
}
