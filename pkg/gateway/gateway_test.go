package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

const (
	realKey   = "sk-ant-api03-REAL-worker-key-never-in-a-sandbox"
	testModel = "claude-sonnet-5-5-20261007"
)

type testBundle struct {
	fake   *anthropicfake.Server
	gw     *gateway.Gateway
	events chan modelEvent
	limits chan gateway.RateLimit
	client *http.Client
}

type modelEvent struct {
	run gateway.RunInfo
	ev  gateway.Event
}

func setup(t *testing.T, reply anthropicfake.ReplyFunc, mod ...func(*gateway.Config)) *testBundle {
	t.Helper()
	b := &testBundle{events: make(chan modelEvent, 100), limits: make(chan gateway.RateLimit, 100)}
	b.fake = anthropicfake.New(t, reply)
	log := zerolog.New(zerolog.NewTestWriter(t))
	cfg := gateway.Config{
		Upstream: b.fake.URL, APIKey: realKey, Logger: &log,
		Publisher:   gateway.PublisherFunc(func(r gateway.RunInfo, ev gateway.Event) { b.events <- modelEvent{r, ev} }),
		OnRateLimit: func(rl gateway.RateLimit) { b.limits <- rl },
	}
	for _, m := range mod {
		m(&cfg)
	}
	gw, err := gateway.Start(cfg)
	require.NoError(t, err)
	b.gw = gw
	tr := &http.Transport{}
	b.client = &http.Client{Transport: tr}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		require.NoError(t, gw.Stop(context.Background()))
	})
	return b
}

// messagesBody is a conversation request as Claude Code sends it (model
// first, tools offered).
func messagesBody(stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model": testModel, "max_tokens": 100, "stream": stream,
		"messages": []any{map[string]any{"role": "user", "content": "hello"}},
		"tools":    []any{map[string]any{"name": "Bash", "input_schema": map[string]any{"type": "object"}}},
	})
	return string(b)
}

func (b *testBundle) post(t *testing.T, ctx context.Context, path, token, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.gw.URL()+path, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("X-Api-Key", token)
	}
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Anthropic-Beta", "claude-code-20250219,interleaved-thinking-2025-05-14")
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

func waitOrTimeout[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting")
		var zero T
		return zero
	}
}

func usageReply(u anthropicfake.Usage) anthropicfake.ReplyFunc {
	return func(*anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("hi")}, Usage: &u}
	}
}

func TestUnauthorizedIsNeverForwarded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	closed, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	b.gw.Close(closed)
	for name, token := range map[string]string{
		"no token":        "",
		"wrong token":     gateway.TokenPrefix + "00112233445566778899aabbccddeeff0011223344556677",
		"the real key":    realKey,
		"an ended run's":  closed,
		"token truncated": closed[:len(closed)-1],
	} {
		resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, name)
		body := readAll(t, resp)
		require.Contains(t, body, `"type":"authentication_error"`, name)
	}
	// Bearer instead of x-api-key, and other paths: still refused.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.gw.URL()+"/v1/models", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+closed)
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	readAll(t, resp)
	require.Empty(t, b.fake.Requests(), "a refused request reached the upstream")
	require.Empty(t, b.events)
}

func TestForwardsStreamWithTheRealCredentialAndMetersIt(t *testing.T) {
	t.Parallel()
	b := setup(t, usageReply(anthropicfake.Usage{InputTokens: 1000, OutputTokens: 200, CacheReadInputTokens: 3000, CacheCreationInputTokens: 500}))
	token, base := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 2})
	require.Equal(t, b.gw.URL(), base)
	require.True(t, strings.HasPrefix(token, gateway.TokenPrefix))

	resp := b.post(t, t.Context(), "/v1/messages?beta=true", token, messagesBody(true))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	body := readAll(t, resp)
	require.Contains(t, body, "event: message_stop")

	reqs := b.fake.Requests()
	require.Len(t, reqs, 1)
	require.Equal(t, realKey, reqs[0].Header.Get("X-Api-Key"))
	require.Empty(t, reqs[0].Header.Get("Authorization"))
	require.Equal(t, "2023-06-01", reqs[0].Header.Get("Anthropic-Version"))
	require.Equal(t, "claude-code-20250219,interleaved-thinking-2025-05-14", reqs[0].Header.Get("Anthropic-Beta"))
	for k, vs := range reqs[0].Header {
		for _, v := range vs {
			require.NotContains(t, v, token, "the run token reached the upstream in %s", k)
		}
	}
	require.Equal(t, testModel, reqs[0].Model)

	got := waitOrTimeout(t, b.events)
	require.Equal(t, "q1", got.run.QueryID)
	ev := got.ev
	ev.MS = 0
	require.Equal(t, gateway.Event{Call: 1, Attempt: 2, Model: testModel, InputTokens: 1000, OutputTokens: 200,
		CacheReadInputTokens: 3000, CacheCreationInputTokens: 500, CostUSD: ev.CostUSD, Status: 200}, ev)
	// claude-sonnet-5-5: $2 in, $10 out, $0.10 cache read, $2.50 cache write per million.
	require.InDelta(t, (1000*2+200*10+3000*0.10+500*2.50)/1e6, ev.CostUSD, 1e-12)
	sum := b.gw.Close(token)
	require.Equal(t, 1, sum.Calls)
	require.InDelta(t, ev.CostUSD, sum.CostUSD, 1e-12)
}

func TestOAuthCredentialIsABearerWithTheOAuthBeta(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, func(c *gateway.Config) { c.APIKey, c.OAuthToken = "", "sk-ant-oat01-REAL-oauth" })
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	readAll(t, resp)
	reqs := b.fake.Requests()
	require.Len(t, reqs, 1)
	require.Equal(t, "Bearer sk-ant-oat01-REAL-oauth", reqs[0].Header.Get("Authorization"))
	require.Empty(t, reqs[0].Header.Get("X-Api-Key"))
	require.Equal(t, "claude-code-20250219,interleaved-thinking-2025-05-14,oauth-2025-04-20", reqs[0].Header.Get("Anthropic-Beta"))
}

func TestNonStreamingAnswerIsMetered(t *testing.T) {
	t.Parallel()
	b := setup(t, usageReply(anthropicfake.Usage{InputTokens: 40, OutputTokens: 7}))
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1, FirstCall: 5})
	for range 2 {
		resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(false))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Contains(t, readAll(t, resp), `"type":"message"`)
	}
	for _, want := range []int{5, 6} {
		ev := waitOrTimeout(t, b.events).ev
		require.Equal(t, want, ev.Call)
		require.Equal(t, int64(40), ev.InputTokens)
		require.Equal(t, int64(7), ev.OutputTokens)
		require.InDelta(t, (40*2+7*10)/1e6, ev.CostUSD, 1e-12)
	}
}

func TestOnlyTheMessagesAPIIsForwarded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	resp := b.post(t, t.Context(), "/v1/messages/count_tokens", token, messagesBody(false))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, readAll(t, resp), "input_tokens")
	require.Len(t, b.fake.Requests(), 1)
	for _, path := range []string{"/v1/messages/batches", "/v1/files", "/api/hello"} {
		resp := b.post(t, t.Context(), path, token, "not json {")
		require.Equal(t, http.StatusNotFound, resp.StatusCode, path)
		require.Contains(t, readAll(t, resp), "not_found_error")
	}
	resp = b.post(t, t.Context(), "/v1/messages/../v1/organizations", token, "not json {")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "a dot segment")
	require.Contains(t, readAll(t, resp), "invalid_request_error")
	require.Len(t, b.fake.Requests(), 1, "a refused path reached the upstream")
	require.Empty(t, b.events, "count_tokens is no model call")
}

func TestMalformedBodyIsForwardedAsTheUpstreamWould(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	resp := b.post(t, t.Context(), "/v1/messages", token, "\x00{not json")
	// The fake answers a body it cannot read as a non-streaming side
	// request: whatever it says reaches the agent unchanged.
	require.Equal(t, http.StatusOK, resp.StatusCode)
	readAll(t, resp)
	ev := waitOrTimeout(t, b.events).ev
	require.Equal(t, "claude-fake", ev.Model, "the model the answer names")
	require.Equal(t, 1, ev.Call)
}

func TestCapTheCrossingCallIsTheLastForwarded(t *testing.T) {
	t.Parallel()
	// Each call costs 1000*$2 + 100*$10 per million = $0.003.
	b := setup(t, usageReply(anthropicfake.Usage{InputTokens: 1000, OutputTokens: 100}))
	caps := make(chan gateway.Cap, 10)
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1, MaxCostUSD: 0.005,
		OnCap: func(c gateway.Cap) { caps <- c }})
	for range 2 {
		resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		readAll(t, resp)
	}
	c := waitOrTimeout(t, caps)
	require.Equal(t, gateway.CapMaxCost, c.Reason)
	require.InDelta(t, 0.006, c.SpentUSD, 1e-12)
	require.Contains(t, c.Message(), "max_cost_usd")

	for range 2 {
		resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
		require.Equal(t, http.StatusPaymentRequired, resp.StatusCode)
		require.Equal(t, "false", resp.Header.Get("X-Should-Retry"))
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		require.NoError(t, json.Unmarshal([]byte(readAll(t, resp)), &e))
		require.Equal(t, "error", e.Type)
		require.Equal(t, "billing_error", e.Error.Type)
		require.Contains(t, e.Error.Message, "max_cost_usd")
	}
	require.Len(t, b.fake.Requests(), 2, "a call past the cap reached the upstream")
	require.Empty(t, caps, "the cap was signalled more than once")
	sum := b.gw.Close(token)
	require.Equal(t, 2, sum.Calls)
	require.InDelta(t, 0.006, sum.CostUSD, 1e-12)
	require.NotNil(t, sum.Capped)
}

func TestEarlierSpendCountsTowardsTheCap(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	caps := make(chan gateway.Cap, 1)
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 2, SpentUSD: 1, MaxCostUSD: 1,
		OnCap: func(c gateway.Cap) { caps <- c }})
	resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
	require.Equal(t, http.StatusPaymentRequired, resp.StatusCode)
	readAll(t, resp)
	require.Equal(t, gateway.CapMaxCost, waitOrTimeout(t, caps).Reason)
	require.Empty(t, b.fake.Requests())
}

func TestTenantBudgetCountsEveryOpenRunOfTheTenant(t *testing.T) {
	t.Parallel()
	b := setup(t, usageReply(anthropicfake.Usage{InputTokens: 1000, OutputTokens: 100})) // $0.003 a call
	var mu sync.Mutex
	remaining := 0.005
	budget := func() (float64, bool) { mu.Lock(); defer mu.Unlock(); return remaining, true }
	caps := make(chan gateway.Cap, 10)
	onCap := func(c gateway.Cap) { caps <- c }
	a, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "a", Attempt: 1, TenantBudget: budget, OnCap: onCap})
	c, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "c", Attempt: 1, TenantBudget: budget, OnCap: onCap})
	other, _ := b.gw.Open(gateway.RunInfo{Tenant: "other", QueryID: "o", Attempt: 1, TenantBudget: func() (float64, bool) { return 1, true }})
	for _, tok := range []string{a, c} {
		resp := b.post(t, t.Context(), "/v1/messages", tok, messagesBody(true))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		readAll(t, resp)
	}
	require.Equal(t, gateway.CapTenantBudget, waitOrTimeout(t, caps).Reason)
	resp := b.post(t, t.Context(), "/v1/messages", a, messagesBody(true))
	require.Equal(t, http.StatusPaymentRequired, resp.StatusCode)
	require.Contains(t, readAll(t, resp), "budget")
	resp = b.post(t, t.Context(), "/v1/messages", other, messagesBody(true))
	require.Equal(t, http.StatusOK, resp.StatusCode, "another tenant's run was capped")
	readAll(t, resp)
	require.Len(t, b.fake.Requests(), 3)
}

func TestRateLimitsPassThroughAndAreReported(t *testing.T) {
	t.Parallel()
	reset := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	for _, tc := range []struct {
		status int
		header map[string]string
		until  func(before, after time.Time) (time.Time, time.Time)
	}{
		{429, map[string]string{"Retry-After": "7", "Anthropic-Ratelimit-Requests-Reset": reset.Format(time.RFC3339)},
			func(b, a time.Time) (time.Time, time.Time) { return b.Add(7 * time.Second), a.Add(7 * time.Second) }},
		{429, map[string]string{"Anthropic-Ratelimit-Tokens-Reset": reset.Format(time.RFC3339), "X-Should-Retry": "false"},
			func(time.Time, time.Time) (time.Time, time.Time) { return reset, reset }},
		{529, nil, func(time.Time, time.Time) (time.Time, time.Time) { return time.Time{}, time.Time{} }},
	} {
		b := setup(t, func(*anthropicfake.Request) anthropicfake.Reply {
			return anthropicfake.Reply{Status: tc.status, Header: tc.header}
		})
		token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
		before := time.Now()
		resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
		require.Equal(t, tc.status, resp.StatusCode)
		for k, v := range tc.header {
			require.Equal(t, v, resp.Header.Get(k))
		}
		require.Contains(t, readAll(t, resp), `"type":"error"`)
		rl := waitOrTimeout(t, b.limits)
		after := time.Now()
		require.Equal(t, gateway.RateLimit{Tenant: "acme", QueryID: "q1", Status: tc.status, Until: rl.Until}, rl)
		lo, hi := tc.until(before, after)
		require.False(t, rl.Until.Before(lo) || rl.Until.After(hi), "until %v not in [%v, %v]", rl.Until, lo, hi)
		ev := waitOrTimeout(t, b.events).ev
		require.Equal(t, tc.status, ev.Status)
		require.Equal(t, testModel, ev.Model)
		require.Zero(t, ev.CostUSD)
	}
}

func TestUpstreamDropMidStreamBreaksTheAgentsStream(t *testing.T) {
	t.Parallel()
	b := setup(t, func(*anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("partial"), anthropicfake.Text("never")},
			Drop: true, Usage: &anthropicfake.Usage{InputTokens: 500, OutputTokens: 50}}
	})
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Error(t, err, "the broken stream ended cleanly for the agent")
	require.Contains(t, string(body), "partial")
	require.NotContains(t, string(body), "message_stop")
	// The input the upstream reported in message_start is billed.
	ev := waitOrTimeout(t, b.events).ev
	require.Equal(t, int64(500), ev.InputTokens)
	require.Positive(t, ev.CostUSD)
}

func TestUpstreamThatHangsIsLeftWhenTheAgentGoes(t *testing.T) {
	t.Parallel()
	stall := make(chan struct{})
	t.Cleanup(func() { close(stall) })
	seen := make(chan struct{}, 4)
	b := setup(t, func(*anthropicfake.Request) anthropicfake.Reply {
		seen <- struct{}{}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("x")}, Stall: stall}
	})
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.gw.URL()+"/v1/messages", strings.NewReader(messagesBody(true)))
		req.Header.Set("X-Api-Key", token)
		resp, err := b.client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		done <- err
	}()
	waitOrTimeout(t, seen)
	cancel()
	require.ErrorIs(t, waitOrTimeout(t, done), context.Canceled)

	// A hanging call of a run whose token is closed is cut off too.
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, b.gw.URL()+"/v1/messages", strings.NewReader(messagesBody(true)))
		req.Header.Set("X-Api-Key", token)
		resp, err := b.client.Do(req)
		if err == nil {
			_, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		done <- err
	}()
	waitOrTimeout(t, seen)
	b.gw.Close(token)
	waitOrTimeout(t, done)
}

func TestUpstreamUnreachableIsABadGateway(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	b := setup(t, nil, func(c *gateway.Config) { c.Upstream = "http://" + addr })
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	body := readAll(t, resp)
	require.Contains(t, body, `"type":"api_error"`)
	require.NotContains(t, body, realKey)
	require.Empty(t, b.events, "no upstream answered: no call")
}

func TestStartRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]gateway.Config{
		"no credential":    {Upstream: "http://127.0.0.1:1"},
		"bad upstream":     {Upstream: "ftp://x", APIKey: "k"},
		"not loopback":     {Upstream: "http://127.0.0.1:1", APIKey: "k", Addr: "0.0.0.0:0"},
		"upstream no host": {Upstream: "http://", APIKey: "k"},
	} {
		_, err := gateway.Start(cfg)
		require.Error(t, err, name)
		require.NotContains(t, err.Error(), "k\"", name)
	}
}

// TestStreamPassesByteForByteAndUnbuffered serves a stream in odd chunks,
// holding the upstream after the first one: the agent has that chunk
// before the upstream goes on, and the whole body arrives unchanged.
func TestStreamPassesByteForByteAndUnbuffered(t *testing.T) {
	t.Parallel()
	first := "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-haiku-5-5\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\r\n\r\n"
	var rest bytes.Buffer
	rest.WriteString(": comment \x00\xff\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n")
	rest.WriteString("event: content_block_delta\ndata: " + strings.Repeat("é", 70000) + "\n\n")
	rest.WriteString("event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\nevent: message_stop\ndata: {}\n\n")
	goOn := make(chan struct{})
	up := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Request-Id", "req_1")
		_, _ = io.WriteString(w, first)
		w.(http.Flusher).Flush()
		select {
		case <-goOn:
		case <-r.Context().Done():
			return
		}
		for b := rest.Bytes(); len(b) > 0; {
			n := min(len(b), 777)
			_, _ = w.Write(b[:n])
			w.(http.Flusher).Flush()
			b = b[n:]
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() { defer close(served); _ = up.Serve(ln) }()
	t.Cleanup(func() { _ = up.Close(); <-served })

	b := setup(t, nil, func(c *gateway.Config) { c.Upstream = "http://" + ln.Addr().String() })
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, "req_1", resp.Header.Get("Request-Id"))
	got := make([]byte, len(first))
	_, err = io.ReadFull(resp.Body, got)
	require.NoError(t, err)
	require.Equal(t, first, string(got))
	close(goOn)
	tail, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, rest.String(), string(tail))
	ev := waitOrTimeout(t, b.events).ev
	require.Equal(t, "claude-haiku-5-5", ev.Model)
	require.Equal(t, int64(3), ev.InputTokens)
	require.Equal(t, int64(9), ev.OutputTokens)
}

func TestCloseCutsOffAndAccountsACallInFlight(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	held := make(chan struct{}, 1)
	b := setup(t, func(*anthropicfake.Request) anthropicfake.Reply {
		held <- struct{}{}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("a"), anthropicfake.Text("b")},
			Hold: hold, Usage: &anthropicfake.Usage{InputTokens: 1000, OutputTokens: 10}}
	})
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	resp := b.post(t, t.Context(), "/v1/messages", token, messagesBody(true))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	waitOrTimeout(t, held)
	// The agent has the stream's start: message_start has passed.
	got := make([]byte, 20)
	_, err := io.ReadFull(resp.Body, got)
	require.NoError(t, err)
	sum := b.gw.Close(token)
	require.Equal(t, 1, sum.Calls, "the call cut off is in the summary")
	require.InDelta(t, 1000*2/1e6+1*10/1e6, sum.CostUSD, 1e-12, "its input is billed")
	_, err = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Error(t, err, "the agent's stream broke")
	require.Equal(t, 1, waitOrTimeout(t, b.events).ev.Call)
}

func TestServesOnAnotherListener(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	sock := filepath.Join(t.TempDir(), "gw.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	b.gw.Serve(ln)
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://gateway/v1/messages", strings.NewReader(messagesBody(true)))
	require.NoError(t, err)
	req.Header.Set("X-Api-Key", token)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, readAll(t, resp), "message_stop")
	require.Equal(t, 1, waitOrTimeout(t, b.events).ev.Call)
}

func TestStopCutsOffCallsInFlight(t *testing.T) {
	t.Parallel()
	stall := make(chan struct{})
	t.Cleanup(func() { close(stall) })
	seen := make(chan struct{}, 1)
	b := setup(t, func(*anthropicfake.Request) anthropicfake.Reply {
		seen <- struct{}{}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("x")}, Stall: stall}
	})
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, b.gw.URL()+"/v1/messages", strings.NewReader(messagesBody(true)))
		req.Header.Set("X-Api-Key", token)
		resp, err := b.client.Do(req)
		if err == nil {
			_, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		done <- err
	}()
	waitOrTimeout(t, seen)
	require.NoError(t, b.gw.Stop(t.Context()))
	waitOrTimeout(t, done)
	require.NoError(t, b.gw.Stop(t.Context()), "a second Stop")
}

func TestRateLimitReachesAdmissionAsALine(t *testing.T) {
	t.Parallel()
	now := time.Now()
	until := now.Add(90 * time.Second).Truncate(time.Second)
	line, ok := gateway.RateLimit{Tenant: "acme", Status: 429, Until: until}.AdmissionLine()
	require.True(t, ok)
	require.True(t, protocol.MayReportRateLimit(line))
	got, hit := admission.RateLimitUntil(line, now, time.Minute)
	require.True(t, hit)
	require.Equal(t, until.Unix(), got.Unix())
	line, ok = gateway.RateLimit{Tenant: "acme", Status: 429}.AdmissionLine()
	require.True(t, ok)
	got, hit = admission.RateLimitUntil(line, now, time.Minute)
	require.True(t, hit)
	require.Equal(t, now.Add(time.Minute), got, "no reset: admission's default pause")
	_, ok = gateway.RateLimit{Tenant: "acme", Status: 529}.AdmissionLine()
	require.False(t, ok, "an overloaded upstream pauses no tenant")
}

func TestCredentialsFromEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{"ANTHROPIC_AUTH_TOKEN": "sk-gw-token"}
	var cfg gateway.Config
	cfg.CredentialsFromEnv(func(k string) string { return env[k] })
	require.Equal(t, "sk-gw-token", cfg.AuthToken)
	require.Empty(t, cfg.APIKey)
	for _, n := range []string{"ANTHROPIC_API_KEY", "claude_code_oauth_token", "ANTHROPIC_AUTH_TOKEN"} {
		require.True(t, gateway.IsCredentialEnv(n), n)
	}
	require.False(t, gateway.IsCredentialEnv("ANTHROPIC_BASE_URL"))

	b := setup(t, nil, func(c *gateway.Config) { c.APIKey, c.AuthToken = "", "sk-gw-token" })
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	readAll(t, b.post(t, t.Context(), "/v1/messages", token, messagesBody(true)))
	h := b.fake.Requests()[0].Header
	require.Equal(t, "Bearer sk-gw-token", h.Get("Authorization"))
	require.NotContains(t, h.Get("Anthropic-Beta"), "oauth")
}

func TestAgentGoingMidStreamCancelsTheUpstream(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	b := setup(t, func(*anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("a"), anthropicfake.Text("b")},
			Hold: hold, Usage: &anthropicfake.Usage{InputTokens: 700, OutputTokens: 10}}
	})
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	ctx, cancel := context.WithCancel(t.Context())
	resp := b.post(t, ctx, "/v1/messages", token, messagesBody(true))
	got := make([]byte, 20)
	_, err := io.ReadFull(resp.Body, got)
	require.NoError(t, err)
	cancel()
	_ = resp.Body.Close()
	// The upstream request ends with the agent's: the call is accounted
	// with what the stream had reported, while the fake still holds.
	ev := waitOrTimeout(t, b.events).ev
	require.Equal(t, int64(700), ev.InputTokens)
	require.Equal(t, 1, b.gw.Spent(token).Calls)
}

// TestAnswerMayStartBeforeTheRequestEnds: an upstream that answers while
// the agent is still sending its body (the transport reads it to its end
// after the answer began) gets the whole body, and the agent the whole
// answer.
func TestAnswerMayStartBeforeTheRequestEnds(t *testing.T) {
	t.Parallel()
	up := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: ping\ndata: {}\n\n")
		w.(http.Flusher).Flush()
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		_, _ = io.WriteString(w, "event: got\ndata: "+string(b)+"\n\n")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() { defer close(served); _ = up.Serve(ln) }()
	t.Cleanup(func() { _ = up.Close(); <-served })

	b := setup(t, nil, func(c *gateway.Config) { c.Upstream = "http://" + ln.Addr().String() })
	token, _ := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "q1", Attempt: 1})
	part1, part2 := `{"model":"claude-haiku-5-5",`, `"stream":true}`
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.gw.URL()+"/v1/messages", pr)
	require.NoError(t, err)
	req.ContentLength = int64(len(part1) + len(part2))
	req.Header.Set("X-Api-Key", token)
	go func() { _, _ = io.WriteString(pw, part1) }()
	got := make(chan *http.Response, 1)
	go func() {
		resp, err := b.client.Do(req)
		if err == nil {
			got <- resp
		}
	}()
	resp := waitOrTimeout(t, got)
	defer func() { _ = resp.Body.Close() }()
	first := make([]byte, len("event: ping\ndata: {}\n\n"))
	_, err = io.ReadFull(resp.Body, first)
	require.NoError(t, err)
	_, err = io.WriteString(pw, part2)
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	rest, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "event: got\ndata: "+part1+part2+"\n\n", string(rest))
}
