package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// oauthBeta is the beta Claude Code adds when it sends an OAuth token.
const oauthBeta = "oauth-2025-04-20"

// sniffBytes is how much of a request body is kept to read its model.
const sniffBytes = 4 << 10

// hopHeaders are connection-level headers a proxy does not pass on
// (RFC 9110 7.6.1), dropped from the upstream's answer. (What goes
// upstream is an allow-list: upstreamHeader.)
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// ServeHTTP checks the run's token, refuses what is not an exact route of
// the Messages API (route.go) or is over a cap, and forwards the rest
// upstream as the route the gateway built.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r := g.lookup(req)
	if r == nil {
		writeError(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key: not a token of a running job")
		return
	}
	defer r.inflight.Done()
	rt, ref := matchRoute(req.Method, req.RequestURI)
	if ref != nil {
		writeError(w, ref.status, ref.typ, ref.msg)
		return
	}
	if rt.metered {
		if c := g.capOf(r); c != nil {
			g.signal(r, c)
			w.Header().Set("X-Should-Retry", "false")
			writeError(w, http.StatusPaymentRequired, "billing_error", c.Message())
			return
		}
	}
	g.forward(w, req, r, rt)
}

// writeError answers with an Anthropic-shaped error.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// prefixKeeper keeps the first sniffBytes of what is read through it. The
// transport may still be reading the body when the answer has come, so
// the prefix is guarded.
type prefixKeeper struct {
	r   io.ReadCloser
	mu  sync.Mutex
	buf []byte
}

func (p *prefixKeeper) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.mu.Lock()
	if room := sniffBytes - len(p.buf); room > 0 {
		p.buf = append(p.buf, b[:min(n, room)]...)
	}
	p.mu.Unlock()
	return n, err
}

func (p *prefixKeeper) Close() error { return p.r.Close() }

// model is the request's model, read from the prefix kept so far.
func (p *prefixKeeper) model() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return sniffModel(p.buf)
}

// outbound builds the upstream request: the route's method, path and
// query as the gateway built them, the allowed headers of the agent's
// (upstreamHeader) and the worker's credential.
func (g *Gateway) outbound(ctx context.Context, req *http.Request, rt route, body io.ReadCloser) (*http.Request, error) {
	u := url.URL{Scheme: g.upstream.Scheme, Host: g.upstream.Host,
		Path: strings.TrimSuffix(g.upstream.Path, "/") + rt.path, RawQuery: rt.query}
	out, err := http.NewRequestWithContext(ctx, req.Method, u.String(), body)
	if err != nil {
		return nil, err
	}
	out.ContentLength = req.ContentLength
	if req.Body == nil || req.ContentLength == 0 {
		out.Body = http.NoBody
	}
	// The agent's Accept-Encoding is not passed, so the transport asks for
	// gzip itself and hands on the decoded stream, which the meter reads.
	out.Header = upstreamHeader(req.Header)
	switch {
	case g.cfg.APIKey != "":
		out.Header.Set("X-Api-Key", g.cfg.APIKey)
	case g.cfg.OAuthToken != "":
		out.Header.Set("Authorization", "Bearer "+g.cfg.OAuthToken)
		if b := out.Header.Get("Anthropic-Beta"); !strings.Contains(b, oauthBeta) {
			out.Header.Set("Anthropic-Beta", strings.TrimPrefix(b+","+oauthBeta, ","))
		}
	default:
		out.Header.Set("Authorization", "Bearer "+g.cfg.AuthToken)
	}
	return out, nil
}

// dropHop removes hop-by-hop headers, those Connection names included.
func dropHop(h http.Header) {
	for _, c := range h.Values("Connection") {
		for f := range strings.SplitSeq(c, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// call is one forwarded request's accounting.
type call struct {
	start  time.Time
	status int
	model  string
	usage  Usage
	sse    *sseMeter
	json   *jsonMeter
}

// forward sends req upstream for run r and streams the answer back, chunk
// by chunk, flushing each; a metered call is accounted and published once
// its last byte has passed (or the stream broke).
func (g *Gateway) forward(w http.ResponseWriter, req *http.Request, r *run, rt route) {
	metered := rt.metered
	c := &call{start: time.Now()}
	// The transport may still be reading the agent's body (to its EOF)
	// when the answer starts: without full duplex the server would take
	// and close that body at the first write, breaking the upstream call.
	_ = http.NewResponseController(w).EnableFullDuplex()
	ctx, cancel := context.WithCancel(req.Context())
	defer cancel()
	stop := context.AfterFunc(r.ctx, cancel)
	defer stop()
	body := &prefixKeeper{r: req.Body}
	out, err := g.outbound(ctx, req, rt, body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "the model gateway could not forward the request: "+err.Error())
		return
	}
	span := g.chatSpan(r, out, metered)
	defer func() { span.end(c) }()
	resp, err := g.client.Do(out)
	if err != nil {
		span.fail(err)
		if req.Context().Err() == nil {
			g.log.Warn().Err(err).Str("query_id", r.info.QueryID).Msg("model upstream unreachable")
			writeError(w, http.StatusBadGateway, "api_error", "the model upstream could not be reached: "+err.Error())
		}
		return
	}
	defer func() { _ = resp.Body.Close() }()
	c.status = resp.StatusCode
	span.firstByte(c)
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	dropHop(h)
	w.WriteHeader(resp.StatusCode)
	var meter io.Writer = io.Discard
	if metered && resp.StatusCode == http.StatusOK {
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			c.sse = newSSEMeter()
			meter = c.sse
		} else {
			c.json = &jsonMeter{}
			meter = c.json
		}
	}
	broken := copyFlush(w, resp.Body, meter)
	if broken != nil && req.Context().Err() == nil && r.ctx.Err() == nil {
		g.log.Warn().Err(broken).Str("query_id", r.info.QueryID).Msg("model upstream broke off mid-answer")
	}
	if metered {
		c.model = body.model()
		g.finish(r, c)
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == 529 {
		g.rateLimited(r, resp)
	}
	if broken != nil {
		// The upstream broke off: break the agent's connection too, so it
		// sees the stream fail rather than end.
		panic(http.ErrAbortHandler)
	}
}

// bufPool holds copy buffers, so a call allocates none.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyFlush copies src to w, flushing after every read, and feeds each
// chunk to meter. broken is src's error when it failed (not at its end)
// while the agent was still there.
func copyFlush(w http.ResponseWriter, src io.Reader, meter io.Writer) (broken error) {
	rc := http.NewResponseController(w)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for {
		n, err := src.Read(buf)
		if n > 0 {
			_, _ = meter.Write(buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				return nil
			}
			if ferr := rc.Flush(); ferr != nil {
				return nil
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// finish prices a metered call, adds it to its run, publishes its event
// and signals a cap it crossed.
func (g *Gateway) finish(r *run, c *call) {
	switch {
	case c.sse != nil:
		c.usage = c.sse.usage
		if c.sse.model != "" {
			c.model = c.sse.model
		}
	case c.json != nil:
		if m, u, ok := c.json.decode(); ok {
			c.usage = u
			if m != "" {
				c.model = m
			}
		}
	}
	price, known := g.cfg.Prices.Lookup(c.model)
	if !known && c.usage != (Usage{}) {
		g.log.Warn().Str("model", c.model).Str("fallback", FallbackModel).Msg("model not in the price table: priced as the fallback")
	}
	cost := price.Cost(c.usage)
	n := g.account(r, cost)
	ev := Event{
		Call: n, Attempt: r.info.Attempt, Model: c.model,
		InputTokens: c.usage.InputTokens, OutputTokens: c.usage.OutputTokens,
		CacheReadInputTokens: c.usage.CacheReadInputTokens, CacheCreationInputTokens: c.usage.CacheCreationInputTokens,
		CostUSD: cost, Status: c.status, MS: time.Since(c.start).Milliseconds(),
	}
	if g.cfg.Publisher != nil {
		g.cfg.Publisher.PublishModel(r.info, ev)
	}
	if cp := g.capOf(r); cp != nil {
		g.signal(r, cp)
	}
}
