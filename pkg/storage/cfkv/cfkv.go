package cfkv

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	cloudflare "github.com/cloudflare/cloudflare-go/v4"
	"github.com/cloudflare/cloudflare-go/v4/kv"
	"github.com/cloudflare/cloudflare-go/v4/option"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Workers KV limits (developers.cloudflare.com/kv/platform/limits).
const (
	// MaxValueBytes is the largest value KV stores (25 MiB).
	MaxValueBytes = 25 << 20
	// MaxKeyBytes is the longest key KV accepts. storage.ValidateKey already
	// caps keys at storage.MaxKeyBytes (480), below it.
	MaxKeyBytes = 512
	// MaxMetadataBytes is the largest metadata (JSON) KV stores per key.
	MaxMetadataBytes = 1024
	// MinTTL is the shortest expiration_ttl KV accepts.
	MinTTL = 60 * time.Second
)

// DefaultEndpoint is Cloudflare's v4 API base URL.
const DefaultEndpoint = "https://api.cloudflare.com/client/v4/"

// TokenEnv is the environment variable Open reads the API token from.
const TokenEnv = "CLOUDFLARE_API_TOKEN"

// ErrClosed is returned by every call on a closed Store.
var ErrClosed = errors.New("cfkv: store closed")

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Config configures a Store. AccountID, NamespaceID and Token are required.
type Config struct {
	// AccountID is the Cloudflare account id. Required.
	AccountID string
	// NamespaceID is the KV namespace id. Required.
	NamespaceID string
	// Token is an API token with Workers KV Storage edit permission.
	// Required. It is sent as a bearer token and never logged.
	Token string
	// Endpoint is the API base URL. Defaults to DefaultEndpoint; set it for
	// proxies and test servers.
	Endpoint string
	// HTTPClient sends the requests. Defaults to a client with no timeout
	// of its own (requests are bounded by OpTimeout).
	HTTPClient *http.Client
	// Budget is the number of API requests this Store may send per
	// BudgetWindow. Cloudflare allows 1,200 requests per 5 minutes per
	// token (or user) for the whole account, dashboard included: when
	// several processes share a token, give each its share. Defaults to
	// 1200.
	Budget int
	// BudgetWindow is the window of Budget. Defaults to 5 minutes.
	BudgetWindow time.Duration
	// Burst is how many requests may go out back to back; the steady rate
	// is (Budget-Burst)/BudgetWindow, so no window ever holds more than
	// Budget requests. Defaults to min(10, Budget/2).
	Burst int
	// KeyWriteInterval is the least time between the end of one write of a
	// key and the start of the next (KV allows one write per key per
	// second). Defaults to 1.1 s.
	KeyWriteInterval time.Duration
	// ExpirationTTL, when set, makes every written key expire after it.
	// At least 60 s. Defaults to 0 (keys never expire).
	ExpirationTTL time.Duration
	// Metadata, when set, returns the metadata stored with each key (any
	// JSON-encodable value of at most 1024 bytes encoded, e.g. a status
	// record's state, so the dashboard and key listings show it). Metadata
	// that does not encode or is too large is dropped with a warning.
	// Defaults to nil (no metadata).
	Metadata func(key string, value []byte) any
	// MaxRetries is how many times one request is retried after a 429, a
	// 5xx or a transport failure, honouring Retry-After. A negative value
	// means no retries. Defaults to 6.
	MaxRetries int
	// MaxBackoff caps the wait between retries when the server does not
	// say how long to wait; Retry-After is honoured up to MaxRetryAfter.
	// Defaults to 30 s.
	MaxBackoff time.Duration
	// MaxRetryAfter caps how long a Retry-After is honoured (Cloudflare
	// blocks an account that went over its budget for 5 minutes). Defaults
	// to 5 minutes.
	MaxRetryAfter time.Duration
	// OpTimeout bounds one HTTP request. Defaults to 60 s.
	OpTimeout time.Duration
	// CloseTimeout bounds how long Close waits for pending writes.
	// Defaults to 30 s.
	CloseTimeout time.Duration
	// ListPageSize is the number of keys asked for per list request
	// (10…1000). Defaults to 1000.
	ListPageSize int
	// Logger receives retry and dropped-metadata warnings. Defaults to a
	// no-op logger.
	Logger *zerolog.Logger
}

func (c Config) withDefaults() Config {
	c.Endpoint = cmp.Or(c.Endpoint, DefaultEndpoint)
	c.Budget = cmp.Or(c.Budget, 1200)
	c.BudgetWindow = cmp.Or(c.BudgetWindow, 5*time.Minute)
	c.Burst = cmp.Or(c.Burst, max(1, min(10, c.Budget/2)))
	c.KeyWriteInterval = cmp.Or(c.KeyWriteInterval, 1100*time.Millisecond)
	switch {
	case c.MaxRetries == 0:
		c.MaxRetries = 6
	case c.MaxRetries < 0:
		c.MaxRetries = 0
	}
	c.MaxBackoff = cmp.Or(c.MaxBackoff, 30*time.Second)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, 5*time.Minute)
	c.OpTimeout = cmp.Or(c.OpTimeout, 60*time.Second)
	c.CloseTimeout = cmp.Or(c.CloseTimeout, 30*time.Second)
	c.ListPageSize = cmp.Or(c.ListPageSize, 1000)
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	return c
}

func (c Config) validate() error {
	switch {
	case !idPattern.MatchString(c.AccountID):
		return fmt.Errorf("cfkv: AccountID %q must be 1 to 64 characters of [A-Za-z0-9_-]", c.AccountID)
	case !idPattern.MatchString(c.NamespaceID):
		return fmt.Errorf("cfkv: NamespaceID %q must be 1 to 64 characters of [A-Za-z0-9_-]", c.NamespaceID)
	case c.Token == "":
		return errors.New("cfkv: Token is required (" + TokenEnv + ")")
	case c.Budget < 2:
		return fmt.Errorf("cfkv: Budget must be at least 2, got %d", c.Budget)
	case c.BudgetWindow <= 0:
		return fmt.Errorf("cfkv: BudgetWindow must be positive, got %s", c.BudgetWindow)
	case c.Burst < 1 || c.Burst >= c.Budget:
		return fmt.Errorf("cfkv: Burst must be between 1 and Budget-1 (%d), got %d", c.Budget-1, c.Burst)
	case c.KeyWriteInterval < 0:
		return fmt.Errorf("cfkv: KeyWriteInterval must not be negative, got %s", c.KeyWriteInterval)
	case c.ExpirationTTL != 0 && c.ExpirationTTL < MinTTL:
		return fmt.Errorf("cfkv: ExpirationTTL must be 0 or at least %s, got %s", MinTTL, c.ExpirationTTL)
	case c.ListPageSize < 10 || c.ListPageSize > 1000:
		return fmt.Errorf("cfkv: ListPageSize must be between 10 and 1000, got %d", c.ListPageSize)
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("cfkv: Endpoint %q must be an http(s) base URL without query", c.Endpoint)
	}
	return nil
}

// Store is a storage.Store on one Workers KV namespace, for status records
// (small values written now and then). It does not implement
// storage.Creator (KV has no conditional write) nor storage.StreamPutter.
// It is safe for concurrent use.
type Store struct {
	cfg     Config
	nsvc    *kv.NamespaceService
	limiter *rate.Limiter
	log     zerolog.Logger
	w       *writer

	closeOnce sync.Once
	closeErr  error
}

var _ storage.Store = (*Store)(nil)

// ParseURL turns a URL of the form
//
//	cfkv://<account_id>/<namespace_id>[?endpoint=<API base URL>&budget=<requests per 5 min>&ttl=<duration>]
//
// into a Config without a token.
func ParseURL(u *url.URL) (Config, error) {
	if u == nil || u.Scheme != "cfkv" {
		return Config{}, errors.New("cfkv: URL must have the cfkv scheme")
	}
	if u.User != nil {
		return Config{}, errors.New("cfkv: credentials do not belong in the URL; set " + TokenEnv)
	}
	ns := strings.Trim(u.Path, "/")
	if u.Host == "" || ns == "" || strings.Contains(ns, "/") {
		return Config{}, fmt.Errorf("cfkv: URL %q must be cfkv://<account_id>/<namespace_id>", u.Redacted())
	}
	cfg := Config{AccountID: u.Host, NamespaceID: ns}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "endpoint":
			cfg.Endpoint = v
		case "budget":
			n, err := strconv.Atoi(v)
			if err != nil || n < 2 {
				return Config{}, fmt.Errorf("cfkv: budget %q must be an integer of at least 2", v)
			}
			cfg.Budget = n
		case "ttl":
			d, err := time.ParseDuration(v)
			if err != nil || d < MinTTL {
				return Config{}, fmt.Errorf("cfkv: ttl %q must be a duration of at least %s", v, MinTTL)
			}
			cfg.ExpirationTTL = d
		default:
			return Config{}, fmt.Errorf("cfkv: unknown URL parameter %q (known: endpoint, budget, ttl)", k)
		}
	}
	return cfg, nil
}

// Open returns a Store for a cfkv:// URL (see ParseURL), with the token
// from CLOUDFLARE_API_TOKEN. logger may be nil.
func Open(ctx context.Context, u *url.URL, logger *zerolog.Logger) (storage.Store, error) {
	return open(ctx, u, logger, os.Getenv)
}

func open(_ context.Context, u *url.URL, logger *zerolog.Logger, getenv func(string) string) (storage.Store, error) {
	cfg, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	cfg.Token = getenv(TokenEnv)
	if cfg.Token == "" {
		return nil, errors.New("cfkv: " + TokenEnv + " is not set")
	}
	cfg.Logger = logger
	return New(cfg)
}

// New returns a Store for cfg and starts its write coalescer. It sends no
// request. Close stops it.
func New(cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := zerolog.Nop()
	if cfg.Logger != nil {
		log = *cfg.Logger
	}
	log = log.With().Str("component", "storage.cfkv").Str("namespace", cfg.NamespaceID).Logger()
	// The services are built from explicit options only: cloudflare.NewClient
	// would also apply CLOUDFLARE_API_KEY / _EMAIL / _BASE_URL from the
	// environment. The SDK's own retries are off (its sleep ignores the
	// context); call retries instead.
	nsvc := kv.NewNamespaceService(
		option.WithBaseURL(cfg.Endpoint),
		option.WithAPIToken(cfg.Token),
		option.WithHTTPClient(cfg.HTTPClient),
		option.WithMaxRetries(0),
	)
	perSecond := float64(cfg.Budget-cfg.Burst) / cfg.BudgetWindow.Seconds()
	s := &Store{
		cfg:     cfg,
		nsvc:    nsvc,
		limiter: rate.NewLimiter(rate.Limit(perSecond), cfg.Burst),
		log:     log,
	}
	s.w = newWriter(s)
	return s, nil
}

// escapeKey percent-encodes a key as one path segment. cloudflare-go puts
// the key into the path with fmt.Sprintf and no escaping, so without this
// "status/t/q.json" would become three segments (a 404) and '?' or '#'
// would cut the path.
func escapeKey(key string) string { return url.PathEscape(key) }

func (s *Store) begin(ctx context.Context, op, key string) error {
	if s.w.isClosed() {
		return fmt.Errorf("cfkv: %s %q: %w", op, key, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cfkv: %s %q: %w", op, key, err)
	}
	if err := storage.ValidateKey(key); err != nil {
		return fmt.Errorf("cfkv: %s: %w", op, err)
	}
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("cfkv: %s: key of %d bytes: %w", op, len(key), storage.ErrInvalidKey)
	}
	return nil
}

// Put implements storage.Store. Writes go through the coalescer: Put
// returns once its value, or a newer value (or delete) of the same key
// given later, has been written, so at most one write per key is sent per
// KeyWriteInterval and several keys pending at once share one bulk write.
// If ctx ends before the value was sent, the value is withdrawn unless
// another Put or Delete of the key is waiting for it.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	if err := s.begin(ctx, "put", key); err != nil {
		return err
	}
	if len(value) > MaxValueBytes {
		return fmt.Errorf("cfkv: put %q: %d bytes (Workers KV allows %d): %w", key, len(value), MaxValueBytes, storage.ErrTooLarge)
	}
	op := &writeOp{value: slices.Clone(value)}
	if op.value == nil {
		op.value = []byte{}
	}
	op.meta = s.metadata(key, value)
	if err := s.w.submit(ctx, key, op); err != nil {
		return fmt.Errorf("cfkv: put %q: %w", key, err)
	}
	return nil
}

// Delete implements storage.Store. Deleting a missing key is not an error.
// Deletes share the coalescer with Put: a Delete supersedes a pending Put of
// the same key.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.begin(ctx, "delete", key); err != nil {
		return err
	}
	if err := s.w.submit(ctx, key, &writeOp{del: true}); err != nil {
		return fmt.Errorf("cfkv: delete %q: %w", key, err)
	}
	return nil
}

// metadata encodes Config.Metadata's value for key, or returns nil.
func (s *Store) metadata(key string, value []byte) json.RawMessage {
	if s.cfg.Metadata == nil {
		return nil
	}
	m := s.cfg.Metadata(key, value)
	if m == nil {
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil || len(b) > MaxMetadataBytes {
		s.log.Warn().Err(err).Str("key", key).Int("bytes", len(b)).Msg("dropping key metadata: not JSON-encodable or larger than 1024 bytes")
		return nil
	}
	return b
}

// Get implements storage.Store. KV is eventually consistent: a value
// written elsewhere may take 60 s or more to show.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := s.begin(ctx, "get", key); err != nil {
		return nil, err
	}
	var value []byte
	err := s.call(ctx, "get", key, func(ctx context.Context, opts ...option.RequestOption) error {
		res, err := s.nsvc.Values.Get(ctx, s.cfg.NamespaceID, escapeKey(key),
			kv.NamespaceValueGetParams{AccountID: cloudflare.F(s.cfg.AccountID)}, opts...)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(io.LimitReader(res.Body, MaxValueBytes+1))
		if err != nil {
			return &transportError{err: fmt.Errorf("read value: %w", err)}
		}
		if len(b) > MaxValueBytes {
			return &APIError{Status: http.StatusRequestEntityTooLarge, Errors: []APIErrorItem{{Message: "the API returned more than 25 MiB"}}}
		}
		value = b
		return nil
	})
	if err != nil {
		return nil, err
	}
	return value, nil
}

// List implements storage.Store: every key starting with prefix, sorted,
// read page by page with the keys endpoint's cursor. Key names that are not
// valid storage keys (written by someone else) are skipped.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	if s.w.isClosed() {
		return nil, fmt.Errorf("cfkv: list %q: %w", prefix, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cfkv: list %q: %w", prefix, err)
	}
	keys := []string{}
	cursor := ""
	for page := 0; ; page++ {
		params := kv.NamespaceKeyListParams{
			AccountID: cloudflare.F(s.cfg.AccountID),
			Limit:     cloudflare.F(float64(s.cfg.ListPageSize)),
		}
		if prefix != "" {
			params.Prefix = cloudflare.F(prefix)
		}
		if cursor != "" {
			params.Cursor = cloudflare.F(cursor)
		}
		var names []string
		var next string
		err := s.call(ctx, "list", prefix, func(ctx context.Context, opts ...option.RequestOption) error {
			res, err := s.nsvc.Keys.List(ctx, s.cfg.NamespaceID, params, opts...)
			if err != nil {
				return err
			}
			names = names[:0]
			for _, k := range res.Result {
				names = append(names, k.Name)
			}
			next = res.ResultInfo.Cursor
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if !strings.HasPrefix(n, prefix) || storage.ValidateKey(n) != nil {
				s.log.Debug().Str("kv_key", n).Msg("list: skipping a key name that is not a valid storage key")
				continue
			}
			keys = append(keys, n)
		}
		if next == "" || len(names) == 0 {
			break
		}
		if next == cursor {
			return nil, fmt.Errorf("cfkv: list %q: the API returned the same cursor twice: %w", prefix, storage.ErrUnavailable)
		}
		cursor = next
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// Close implements storage.Store. It waits up to CloseTimeout for pending
// writes to be sent, then fails those left with ErrClosed. Later calls fail
// with ErrClosed; closing twice is fine.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.w.close(s.cfg.CloseTimeout) })
	return s.closeErr
}
