package gateway

import (
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
)

// The gateway forwards exact routes of the Messages API only. A request's
// target is checked as the client sent it (the raw request-target, never
// the decoded path net/http made of it): percent-decoded again and again
// until it stops changing, no layer may hold a "." or ".." segment, a
// backslash, a ';', a control character or an encoded slash, and the raw
// path must be clean (path.Clean leaves it as it is). Only then is it
// matched, byte for byte, against the routes below, and the upstream path
// is the route's own, built by the gateway; the client's path is never
// forwarded. Query parameters the route knows are checked and re-encoded;
// others are dropped.

// maxTarget bounds a request-target the gateway reads.
const maxTarget = 2048

// maxDecodes is how many layers of percent-encoding are unwrapped before
// a path is refused as too deeply encoded.
const maxDecodes = 8

// maxModelID bounds a model id in /v1/models/{id}.
const maxModelID = 128

// Route names (route.name).
const (
	routeMessages    = "messages"
	routeCountTokens = "count_tokens"
	routeModels      = "models"
	routeModel       = "model"
)

// route is one request the gateway forwards, as it forwards it.
type route struct {
	name string
	// path is the upstream path (below the upstream's base path), built
	// by the gateway from the matched route.
	path string
	// query is the re-encoded query: the route's known parameters only.
	query string
	// metered: the call is a model call (POST /v1/messages).
	metered bool
}

// refusal is a request the gateway does not forward: its status and the
// Anthropic error it answers with.
type refusal struct {
	status int
	typ    string
	msg    string
}

func badRequest(msg string) *refusal {
	return &refusal{status: http.StatusBadRequest, typ: "invalid_request_error", msg: "the model gateway refuses the request: " + msg}
}

var notFound = &refusal{status: http.StatusNotFound, typ: "not_found_error",
	msg: "the model gateway forwards only the Messages API: POST /v1/messages, POST /v1/messages/count_tokens, GET /v1/models, GET /v1/models/{model id}"}

// matchRoute decides a request from its method and raw request-target
// (http.Request.RequestURI): the route it is forwarded as, or why not.
func matchRoute(method, target string) (route, *refusal) {
	if len(target) > maxTarget {
		return route{}, badRequest("the request target is too long")
	}
	if !strings.HasPrefix(target, "/") {
		return route{}, badRequest("the request target must be a path (origin form)")
	}
	rawPath, rawQuery, _ := strings.Cut(target, "?")
	if why := checkPath(rawPath); why != "" {
		return route{}, badRequest(why)
	}
	var r route
	switch {
	case rawPath == "/v1/messages" && method == http.MethodPost:
		r = route{name: routeMessages, path: rawPath, metered: true}
	case rawPath == "/v1/messages/count_tokens" && method == http.MethodPost:
		r = route{name: routeCountTokens, path: rawPath}
	case rawPath == "/v1/models" && method == http.MethodGet:
		r = route{name: routeModels, path: rawPath}
	case strings.HasPrefix(rawPath, "/v1/models/") && method == http.MethodGet:
		id := strings.TrimPrefix(rawPath, "/v1/models/")
		if !validModelID(id) {
			return route{}, notFound
		}
		r = route{name: routeModel, path: "/v1/models/" + id}
	default:
		return route{}, notFound
	}
	q, ref := routeQuery(r.name, rawQuery)
	if ref != nil {
		return route{}, ref
	}
	r.query = q
	return r, nil
}

// checkPath returns why a raw path is refused, or "" when it may be
// matched: see the comment at the top of this file.
func checkPath(raw string) string {
	if raw == "" || raw[0] != '/' {
		return "the path must start with /"
	}
	if path.Clean(raw) != raw {
		return "the path is not in its clean form (empty, '.' or '..' segments, or a trailing slash)"
	}
	cur := raw
	for range maxDecodes {
		if why := checkLayer(cur); why != "" {
			return why
		}
		next, err := url.PathUnescape(cur)
		if err != nil {
			return "the path holds a malformed percent-encoding"
		}
		if next == cur {
			return ""
		}
		cur = next
	}
	return "the path is percent-encoded too many times"
}

// checkLayer checks one decoding of a path.
func checkLayer(p string) string {
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c < 0x20 || c == 0x7f:
			return "the path holds a control character"
		case c >= 0x80:
			return "the path holds a byte outside ASCII"
		case c == '\\':
			return "the path holds a backslash"
		case c == ';':
			return "the path holds a ';'"
		case c == '%' && i+2 < len(p) && (p[i+1] == '2' && (p[i+2] == 'f' || p[i+2] == 'F') || p[i+1] == '5' && (p[i+2] == 'c' || p[i+2] == 'C')):
			return "the path holds an encoded slash or backslash"
		}
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return "the path holds a '.' or '..' segment"
		}
	}
	return ""
}

// validModelID accepts a model id: lower-case letters and digits in runs
// joined by single '-', '_' or '.', at most maxModelID bytes (so never
// "." or "..", nor anything that needs encoding).
func validModelID(id string) bool {
	if id == "" || len(id) > maxModelID {
		return false
	}
	prevSep := true
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			prevSep = false
		case c == '-' || c == '_' || c == '.':
			if prevSep {
				return false
			}
			prevSep = true
		default:
			return false
		}
	}
	return !prevSep
}

// routeQuery checks the query parameters a route knows and re-encodes
// them; others are dropped. A known parameter given twice or with a bad
// value is refused.
func routeQuery(name, raw string) (string, *refusal) {
	if raw == "" {
		return "", nil
	}
	in, err := url.ParseQuery(raw)
	if err != nil {
		return "", badRequest("the query string is malformed")
	}
	var known map[string]func(string) bool
	switch name {
	case routeMessages, routeCountTokens:
		known = map[string]func(string) bool{"beta": func(v string) bool { return v == "true" || v == "false" }}
	case routeModels:
		known = map[string]func(string) bool{
			"limit": func(v string) bool {
				n, err := strconv.Atoi(v)
				return err == nil && n >= 1 && n <= 1000 && v == strconv.Itoa(n)
			},
			"after_id":  validModelID,
			"before_id": validModelID,
		}
	}
	out := url.Values{}
	for k, check := range known {
		vs, ok := in[k]
		if !ok {
			continue
		}
		if len(vs) != 1 || !check(vs[0]) {
			return "", badRequest("the query parameter " + strconv.Quote(k) + " has a bad value")
		}
		out.Set(k, vs[0])
	}
	return out.Encode(), nil
}

// forwardedHeaders are the request headers passed upstream (besides every
// X-Stainless-* one, the SDK's description of itself); every other header
// of the agent's, its credential first, is dropped. The gateway sets the
// credential itself.
var forwardedHeaders = []string{
	"Anthropic-Version", "Anthropic-Beta", "Content-Type", "Accept", "User-Agent",
	"X-App", "X-Claude-Code-Session-Id", "Anthropic-Dangerous-Direct-Browser-Access",
}

// upstreamHeader is the header sent upstream: the allowed headers of in.
func upstreamHeader(in http.Header) http.Header {
	out := http.Header{}
	for _, k := range forwardedHeaders {
		if vs := in.Values(k); len(vs) > 0 {
			out[k] = append([]string(nil), vs...)
		}
	}
	for k, vs := range in {
		if strings.HasPrefix(k, "X-Stainless-") {
			out[k] = append([]string(nil), vs...)
		}
	}
	return out
}
