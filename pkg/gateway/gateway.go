package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/protocol"

	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// DefaultUpstream is the Anthropic API, the default --model-upstream.
const DefaultUpstream = "https://api.anthropic.com"

// TokenPrefix starts every run token, so one is told from a real key.
const TokenPrefix = "fleet-run-"

// CredentialEnv lists the variables that hold a model credential: the
// worker reads its own from them (CredentialsFromEnv), and none of them may
// reach an agent from the worker's environment, nor show in the worker's
// /proc environ.
var CredentialEnv = []string{"ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN"}

// IsCredentialEnv reports whether name is one of CredentialEnv (any case).
func IsCredentialEnv(name string) bool {
	for _, c := range CredentialEnv {
		if strings.EqualFold(name, c) {
			return true
		}
	}
	return false
}

// CredentialsFromEnv fills cfg's credential from the worker's environment.
func (cfg *Config) CredentialsFromEnv(getenv func(string) string) {
	cfg.APIKey, cfg.OAuthToken, cfg.AuthToken = getenv(CredentialEnv[0]), getenv(CredentialEnv[1]), getenv(CredentialEnv[2])
}

// Cap reasons (Cap.Reason).
const (
	CapMaxCost      = "max_cost_usd"
	CapTenantBudget = "tenant_budget"
)

// Config configures a Gateway. Upstream and one credential are required.
type Config struct {
	// Tracing makes a "chat <model>" span per metered call, a child of
	// its run's RunInfo.Traceparent, and sends the span's traceparent
	// upstream. Nil: no spans (a run's traceparent is still sent on).
	Tracing *tracing.Tracing
	// Upstream is the API the gateway forwards to (--model-upstream), a
	// base URL without /v1. Defaults to DefaultUpstream.
	Upstream string
	// APIKey is the worker's ANTHROPIC_API_KEY, sent as x-api-key.
	APIKey string
	// OAuthToken is the worker's CLAUDE_CODE_OAUTH_TOKEN, sent as a bearer
	// token (with the oauth beta Claude Code adds), when APIKey is empty.
	OAuthToken string
	// AuthToken is the worker's ANTHROPIC_AUTH_TOKEN (for an upstream that
	// is itself a gateway), sent as a plain bearer token when both others
	// are empty.
	AuthToken string
	// Prices prices each call; nil means DefaultPrices().
	Prices Prices
	// Publisher receives one Event per call the upstream answered. nil
	// drops them (spend is still metered and capped).
	Publisher Publisher
	// OnRateLimit is called for every upstream 429 and 529, after the
	// answer has been passed to the agent. It must not block.
	OnRateLimit func(RateLimit)
	// Addr is the loopback address to listen on. Defaults to 127.0.0.1:0.
	Addr string
	// Transport reaches the upstream. Defaults to a clone of
	// http.DefaultTransport (proxy settings from the environment).
	Transport http.RoundTripper
	// Logger receives the gateway's events (never a token, key or body).
	// Defaults to a no-op logger.
	Logger *zerolog.Logger
}

// Publisher publishes a run's .model events. PublishModel is called once
// per call, in the request's goroutine, after the answer has been passed
// on; it must not block for long (publish asynchronously).
type Publisher interface {
	PublishModel(run RunInfo, ev Event)
}

// PublisherFunc adapts a function to Publisher.
type PublisherFunc func(run RunInfo, ev Event)

// PublishModel calls f.
func (f PublisherFunc) PublishModel(run RunInfo, ev Event) { f(run, ev) }

// Event is the JSON object published on fleet.query.<tenant>.<id>.model for
// each call (docs/gateway.md).
type Event = protocol.ModelEvent

// RunInfo describes the run a token is for.
type RunInfo struct {
	Tenant  string
	QueryID string
	Attempt int
	// FirstCall is the number of this run's first call: 1 plus the calls
	// the query's earlier attempts and turns made (call counts from 1 per
	// query across attempts). 0 means 1.
	FirstCall int
	// SpentUSD is what the query has already spent before this run (an
	// earlier attempt or turn); it counts towards MaxCostUSD. Usually 0.
	SpentUSD float64
	// MaxCostUSD is the job's max_cost_usd; 0 means no cap.
	MaxCostUSD float64
	// TenantBudget, if set, returns what is left of the tenant's budget
	// in its current window, not counting runs open on this gateway
	// (their live spend is added by the gateway); limited is false when
	// the tenant has no budget. It is called before each call and must be
	// quick (a cached value).
	TenantBudget func() (remainingUSD float64, limited bool)
	// OnCap is called once, when a cap is first reached: after the call
	// that crossed it, or at the first call refused with 402. The worker
	// ends the run failed / budget. It must not block, nor call Close
	// (cancel the run; its end closes the token).
	OnCap func(Cap)
	// Traceparent and Tracestate are the W3C trace context of the run
	// (the worker's attempt span): the parent of the run's chat spans.
	Traceparent, Tracestate string
}

// Cap says which cap a run reached.
type Cap struct {
	Reason   string  // CapMaxCost or CapTenantBudget
	SpentUSD float64 // what the run (or, for the tenant, the runs here) spent
	LimitUSD float64
}

// Message is the cap as the agent and the status are told it.
func (c Cap) Message() string {
	if c.Reason == CapTenantBudget {
		return fmt.Sprintf("the tenant's model budget is used up: $%.4f spent of $%.4f left in its window", c.SpentUSD, c.LimitUSD)
	}
	return fmt.Sprintf("the run reached its max_cost_usd: $%.4f spent of $%.4f", c.SpentUSD, c.LimitUSD)
}

// Summary is a run's metered spend.
type Summary struct {
	// Calls is the number of calls the upstream answered for the run.
	Calls int
	// CostUSD is the sum of the run's Event.CostUSD (without RunInfo.SpentUSD).
	CostUSD float64
	// Capped is set once a cap was reached.
	Capped *Cap
}

// Gateway is the model gateway: an HTTP server on loopback that forwards
// the Messages API upstream for runs holding a token.
type Gateway struct {
	cfg      Config
	log      zerolog.Logger
	upstream *url.URL
	client   *http.Client
	ln       net.Listener
	srv      *http.Server
	url      string
	serving  sync.WaitGroup
	stopOnce sync.Once

	mu         sync.Mutex
	runs       map[[32]byte]*run
	unbound    map[[32]byte]bool // OpenUnbound's tokens not yet bound (unbound.go)
	tenantLive map[string]float64
	stopped    bool
}

// run is one open token's state; its numbers are guarded by Gateway.mu.
type run struct {
	info   RunInfo
	ctx    context.Context
	cancel context.CancelFunc
	calls  int
	spent  float64
	capped *Cap
	closed bool
	// inflight counts the run's requests being handled; Close waits for
	// them, so the Summary holds every call that was answered.
	inflight sync.WaitGroup
}

// Start validates cfg, listens on loopback and serves until Stop.
func Start(cfg Config) (*Gateway, error) {
	if cfg.Upstream == "" {
		cfg.Upstream = DefaultUpstream
	}
	up, err := url.Parse(cfg.Upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return nil, fmt.Errorf("gateway: model upstream %q is not an http(s) URL", cfg.Upstream)
	}
	if cfg.APIKey == "" && cfg.OAuthToken == "" && cfg.AuthToken == "" {
		return nil, errors.New("gateway: no model credential (ANTHROPIC_API_KEY, CLAUDE_CODE_OAUTH_TOKEN or ANTHROPIC_AUTH_TOKEN)")
	}
	if cfg.Prices == nil {
		cfg.Prices = DefaultPrices()
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Transport == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		cfg.Transport = tr
	}
	log := zerolog.Nop()
	if cfg.Logger != nil {
		log = cfg.Logger.With().Str("component", "gateway").Logger()
	}
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil || !isLoopback(host) {
		return nil, fmt.Errorf("gateway: address %q is not a loopback address", cfg.Addr)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g := &Gateway{
		cfg: cfg, log: log, upstream: up, ln: ln,
		client:     &http.Client{Transport: cfg.Transport, CheckRedirect: noRedirect},
		url:        "http://" + ln.Addr().String(),
		runs:       map[[32]byte]*run{},
		tenantLive: map[string]float64{},
	}
	g.srv = &http.Server{Handler: g, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	g.serve(ln)
	return g, nil
}

func (g *Gateway) serve(ln net.Listener) {
	g.serving.Add(1)
	go func() {
		defer g.serving.Done()
		_ = g.srv.Serve(ln)
	}()
}

// Serve serves on one more listener (a unix socket a contained sandbox
// relays to a loopback address inside its network namespace, say) until
// Stop, which closes it. A run's agent then gets that address as its base
// URL instead of URL. After Stop it closes ln.
func (g *Gateway) Serve(ln net.Listener) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		_ = ln.Close()
		return
	}
	g.serve(ln)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// noRedirect passes an upstream redirect to the agent instead of following
// it with the worker's credential.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// URL is the gateway's base URL, the agent's ANTHROPIC_BASE_URL.
func (g *Gateway) URL() string { return g.url }

// Open issues a token for one run. The agent gets baseURL as
// ANTHROPIC_BASE_URL and token as ANTHROPIC_API_KEY. The token is valid
// until Close; a resumed session opens a new one.
func (g *Gateway) Open(info RunInfo) (token, baseURL string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	token = TokenPrefix + hex.EncodeToString(b[:])
	if info.FirstCall < 1 {
		info.FirstCall = 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		cancel()
	}
	g.runs[sha256.Sum256([]byte(token))] = &run{info: info, ctx: ctx, cancel: cancel}
	return token, g.url
}

// Close ends a token: later requests with it get 401, and calls still in
// flight are cut off and accounted before it returns the run's metered
// spend. Closing an unknown or closed token returns a zero Summary. It
// must not be called from OnCap or a Publisher.
func (g *Gateway) Close(token string) Summary {
	key := sha256.Sum256([]byte(token))
	g.mu.Lock()
	r := g.runs[key]
	if r == nil {
		g.mu.Unlock()
		return Summary{}
	}
	delete(g.runs, key)
	r.closed = true
	g.addTenant(r.info.Tenant, -r.spent)
	g.mu.Unlock()
	r.cancel()
	r.inflight.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	return Summary{Calls: r.calls, CostUSD: r.spent, Capped: r.capped}
}

// Spent returns an open run's metered spend so far.
func (g *Gateway) Spent(token string) Summary {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.runs[sha256.Sum256([]byte(token))]
	if r == nil {
		return Summary{}
	}
	return Summary{Calls: r.calls, CostUSD: r.spent, Capped: r.capped}
}

func (g *Gateway) addTenant(tenant string, v float64) {
	n := g.tenantLive[tenant] + v
	if n <= 1e-12 {
		delete(g.tenantLive, tenant)
		return
	}
	g.tenantLive[tenant] = n
}

// Stop cuts off every call in flight, closes the listener and waits for
// the server to end (ctx bounds the wait). Stopping twice does nothing.
func (g *Gateway) Stop(ctx context.Context) error {
	var err error
	g.stopOnce.Do(func() {
		g.mu.Lock()
		g.stopped = true
		for _, r := range g.runs {
			r.cancel()
		}
		g.mu.Unlock()
		err = g.srv.Shutdown(ctx)
		if err != nil {
			_ = g.srv.Close()
		}
		g.serving.Wait()
		if tr, ok := g.cfg.Transport.(interface{ CloseIdleConnections() }); ok {
			tr.CloseIdleConnections()
		}
	})
	return err
}

// lookup returns the open run of a request's token (nil if none), its
// inflight count raised: the caller calls r.inflight.Done.
func (g *Gateway) lookup(r *http.Request) *run {
	tok := r.Header.Get("X-Api-Key")
	if tok == "" {
		if a, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			tok = strings.TrimSpace(a)
		}
	}
	if !strings.HasPrefix(tok, TokenPrefix) {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	run := g.runs[sha256.Sum256([]byte(tok))]
	if run != nil {
		run.inflight.Add(1)
	}
	return run
}

// capOf reports the cap a run has reached before its next call, if any.
func (g *Gateway) capOf(r *run) *Cap {
	remaining, limited := 0.0, false
	if r.info.TenantBudget != nil {
		remaining, limited = r.info.TenantBudget()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if r.capped != nil {
		return r.capped
	}
	if m := r.info.MaxCostUSD; m > 0 && r.info.SpentUSD+r.spent >= m {
		return &Cap{Reason: CapMaxCost, SpentUSD: r.info.SpentUSD + r.spent, LimitUSD: m}
	}
	if live := g.tenantLive[r.info.Tenant]; limited && live >= remaining {
		return &Cap{Reason: CapTenantBudget, SpentUSD: live, LimitUSD: remaining}
	}
	return nil
}

// signal records c on r and calls OnCap the first time.
func (g *Gateway) signal(r *run, c *Cap) {
	g.mu.Lock()
	first := r.capped == nil
	if first {
		r.capped = c
	}
	g.mu.Unlock()
	if first {
		g.log.Info().Str("tenant", r.info.Tenant).Str("query_id", r.info.QueryID).Int("attempt", r.info.Attempt).
			Str("reason", c.Reason).Float64("spent_usd", c.SpentUSD).Float64("limit_usd", c.LimitUSD).Msg("model spend cap reached")
		if r.info.OnCap != nil {
			r.info.OnCap(*c)
		}
	}
}

// account adds one answered call's cost to its run and returns its number.
func (g *Gateway) account(r *run, cost float64) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := r.info.FirstCall + r.calls
	r.calls++
	r.spent += cost
	if !r.closed {
		g.addTenant(r.info.Tenant, cost)
	}
	return n
}
