package kvfake

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Limits of Workers KV, as documented (developers.cloudflare.com/kv/platform/limits).
const (
	MaxKeyBytes      = 512
	MaxValueBytes    = 25 << 20
	MaxMetadataBytes = 1024
	MinTTLSeconds    = 60
	MaxBulkItems     = 10000
	MaxBulkBytes     = 100_000_000
	MaxListLimit     = 1000
	MinListLimit     = 10
)

// Error codes the fake answers with (see the package doc for which are verified).
const (
	CodeAuth            = 10000
	CodeKeyNotFound     = 10009
	CodeNoRoute         = 7003
	CodeBadRequest      = 10001
	CodeValueTooLarge   = 10011
	CodeKeyTooLong      = 10019
	CodeKeyRateLimited  = 10100
	CodeAccountThrottle = 971
)

// Route names used in Stats.Requests.
const (
	RoutePutValue    = "PUT values"
	RouteGetValue    = "GET values"
	RouteDeleteValue = "DELETE values"
	RouteGetMetadata = "GET metadata"
	RouteListKeys    = "GET keys"
	RouteBulkPut     = "PUT bulk"
	RouteBulkDelete  = "POST bulk/delete"
)

type entry struct {
	value      []byte
	metadata   json.RawMessage
	expiration int64 // unix seconds, 0 = never
}

// Server is the fake. Create it with New; change the exported fields only
// before the first request.
type Server struct {
	// WriteInterval is the shortest time between two writes of one key
	// (Cloudflare: 1 s). 0 disables the check.
	WriteInterval time.Duration
	// Budget, when > 0, is the number of requests allowed per BudgetWindow;
	// beyond it every request gets 429 (code 971).
	Budget int
	// BudgetWindow is the sliding window of Budget. Defaults to 5 minutes.
	BudgetWindow time.Duration
	// Now is the clock (expiry, rate limits). Defaults to time.Now.
	Now func() time.Time
	// Inject, when set, is asked about every authenticated request; a
	// non-zero status is answered instead of serving it (an outage).
	Inject func(r *http.Request) int
	// BulkUnsuccessful, when set, makes bulk items whose key it returns
	// true for fail (listed in unsuccessful_keys, not written).
	BulkUnsuccessful func(key string) bool

	token, account, namespace string

	mu          sync.Mutex
	data        map[string]entry
	lastWrite   map[string]time.Time
	window      []time.Time
	stats       Stats
	writesByKey map[string]int
}

// Stats counts what the fake saw.
type Stats struct {
	// Requests counts authenticated, routed requests by route name.
	Requests map[string]int
	// KeyRateLimited counts writes refused by the per-key write limit
	// (429 answers plus unsuccessful bulk items).
	KeyRateLimited int
	// BudgetLimited counts requests refused by the account budget.
	BudgetLimited int
	// Unauthorized counts requests refused for a missing or wrong token.
	Unauthorized int
}

// New returns a fake for one account and namespace, accepting token.
func New(token, account, namespace string) *Server {
	return &Server{
		WriteInterval: time.Second,
		BudgetWindow:  5 * time.Minute,
		token:         token,
		account:       account,
		namespace:     namespace,
		data:          map[string]entry{},
		lastWrite:     map[string]time.Time{},
		writesByKey:   map[string]int{},
		stats:         Stats{Requests: map[string]int{}},
	}
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Value returns the stored bytes of key.
func (s *Server) Value(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.live(key)
	if !ok {
		return nil, false
	}
	return bytes.Clone(e.value), true
}

// Metadata returns the stored metadata JSON of key (nil when none).
func (s *Server) Metadata(key string) (json.RawMessage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.live(key)
	if !ok {
		return nil, false
	}
	return bytes.Clone(e.metadata), true
}

// Expiration returns the expiry (unix seconds, 0 = never) of key.
func (s *Server) Expiration(key string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.live(key)
	return e.expiration, ok
}

// Set stores a value directly, bypassing every check.
func (s *Server) Set(key string, value []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data[key] = entry{value: bytes.Clone(value)}
}

// Writes returns how many writes (single or bulk, PUT or DELETE) of key were accepted.
func (s *Server) Writes(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writesByKey[key]
}

// Stats returns a copy of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Requests = make(map[string]int, len(s.stats.Requests))
	for k, v := range s.stats.Requests {
		st.Requests[k] = v
	}
	return st
}

// live returns key's entry unless missing or expired; s.mu must be held.
func (s *Server) live(key string) (entry, bool) {
	e, ok := s.data[key]
	if !ok {
		return entry{}, false
	}
	if e.expiration != 0 && s.now().Unix() >= e.expiration {
		delete(s.data, key)
		return entry{}, false
	}
	return e, true
}

// apiError is one item of the envelope's errors list.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type envelope struct {
	Success    bool       `json:"success"`
	Errors     []apiError `json:"errors"`
	Messages   []apiError `json:"messages"`
	Result     any        `json:"result"`
	ResultInfo any        `json:"result_info,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, status, code int, msg string) {
	writeJSON(w, status, envelope{Errors: []apiError{{Code: code, Message: msg}}, Messages: []apiError{}})
}

func succeed(w http.ResponseWriter, result any, info any) {
	writeJSON(w, http.StatusOK, envelope{Success: true, Errors: []apiError{}, Messages: []apiError{}, Result: result, ResultInfo: info})
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		s.mu.Lock()
		s.stats.Unauthorized++
		s.mu.Unlock()
		fail(w, http.StatusForbidden, CodeAuth, "Authentication error")
		return
	}
	// Segments of the escaped path, so an escaped '/' (%2F) stays inside its segment.
	p := strings.TrimPrefix(r.URL.EscapedPath(), "/")
	p = strings.TrimPrefix(p, "client/v4/")
	seg := strings.Split(p, "/")
	if len(seg) < 7 || seg[0] != "accounts" || seg[2] != "storage" || seg[3] != "kv" || seg[4] != "namespaces" {
		fail(w, http.StatusNotFound, CodeNoRoute, "No route for the URI")
		return
	}
	if seg[1] != s.account || seg[5] != s.namespace {
		fail(w, http.StatusNotFound, CodeNoRoute, "namespace not found")
		return
	}
	rest := seg[6:]
	var route, key string
	switch {
	case len(rest) == 2 && rest[0] == "values" && slices.Contains([]string{http.MethodPut, http.MethodGet, http.MethodDelete}, r.Method):
		route = r.Method + " values"
		key = rest[1]
	case len(rest) == 2 && rest[0] == "metadata" && r.Method == http.MethodGet:
		route, key = RouteGetMetadata, rest[1]
	case len(rest) == 1 && rest[0] == "keys" && r.Method == http.MethodGet:
		route = RouteListKeys
	case len(rest) == 1 && rest[0] == "bulk" && r.Method == http.MethodPut:
		route = RouteBulkPut
	case len(rest) == 2 && rest[0] == "bulk" && rest[1] == "delete" && r.Method == http.MethodPost:
		route = RouteBulkDelete
	default:
		fail(w, http.StatusNotFound, CodeNoRoute, "No route for the URI")
		return
	}
	if strings.HasSuffix(route, " values") || route == RouteGetMetadata {
		k, err := url.PathUnescape(key)
		if err != nil || k == "" {
			fail(w, http.StatusBadRequest, CodeBadRequest, "invalid key name")
			return
		}
		key = k
	}

	if retry, limited := s.charge(route); limited {
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		fail(w, http.StatusTooManyRequests, CodeAccountThrottle, "Please wait and consider throttling your request speed")
		return
	}
	if s.Inject != nil {
		if status := s.Inject(r); status != 0 {
			fail(w, status, 10000+status, "injected failure")
			return
		}
	}
	if len(key) > MaxKeyBytes {
		fail(w, http.StatusRequestURITooLong, CodeKeyTooLong, fmt.Sprintf("key name too long: %d bytes (max %d)", len(key), MaxKeyBytes))
		return
	}
	switch route {
	case RoutePutValue:
		s.putValue(w, r, key)
	case RouteGetValue:
		s.getValue(w, key)
	case RouteDeleteValue:
		s.deleteValue(w, key)
	case RouteGetMetadata:
		s.getMetadata(w, key)
	case RouteListKeys:
		s.listKeys(w, r)
	case RouteBulkPut:
		s.bulkPut(w, r)
	case RouteBulkDelete:
		s.bulkDelete(w, r)
	}
}

func (s *Server) authorized(r *http.Request) bool {
	got, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return found && subtle.ConstantTimeCompare([]byte(got), []byte(s.token)) == 1
}

// charge counts a request against the account budget. It returns the
// Retry-After seconds and true when the budget is used up.
func (s *Server) charge(route string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Requests[route]++
	if s.Budget <= 0 {
		return 0, false
	}
	now := s.now()
	win := s.BudgetWindow
	if win <= 0 {
		win = 5 * time.Minute
	}
	cut := 0
	for cut < len(s.window) && now.Sub(s.window[cut]) >= win {
		cut++
	}
	s.window = s.window[cut:]
	if len(s.window) >= s.Budget {
		s.stats.BudgetLimited++
		wait := win - now.Sub(s.window[0])
		return max(1, int(math.Ceil(wait.Seconds()))), true
	}
	s.window = append(s.window, now)
	return 0, false
}

// allowWrite applies the per-key write limit; s.mu must be held.
func (s *Server) allowWrite(key string, now time.Time) bool {
	if s.WriteInterval <= 0 {
		return true
	}
	if last, ok := s.lastWrite[key]; ok && now.Sub(last) < s.WriteInterval {
		s.stats.KeyRateLimited++
		return false
	}
	return true
}

// recordWrite notes an accepted write of key; s.mu must be held.
func (s *Server) recordWrite(key string, now time.Time) {
	s.lastWrite[key] = now
	s.writesByKey[key]++
}

// expiry computes an entry's expiration from expiration / expiration_ttl
// (TTL wins when both are set, as documented).
func (s *Server) expiry(expiration, ttl *float64) (int64, error) {
	now := s.now().Unix()
	if ttl != nil {
		if *ttl < MinTTLSeconds || math.IsNaN(*ttl) || math.IsInf(*ttl, 0) || *ttl > math.MaxInt32 {
			//lint:ignore ST1005 the fake returns Cloudflare's own message text
			return 0, fmt.Errorf("Invalid expiration_ttl of %v. Expiration TTL must be at least %d", *ttl, MinTTLSeconds)
		}
		return now + int64(*ttl), nil
	}
	if expiration != nil {
		if math.IsNaN(*expiration) || math.IsInf(*expiration, 0) || *expiration > math.MaxInt64/2 || int64(*expiration) < now+MinTTLSeconds {
			//lint:ignore ST1005 the fake returns Cloudflare's own message text
			return 0, fmt.Errorf("Invalid expiration of %v. Expiration times must be at least %d seconds in the future", *expiration, MinTTLSeconds)
		}
		return int64(*expiration), nil
	}
	return 0, nil
}

func queryFloat(q url.Values, name string) (*float64, error) {
	v := q.Get(name)
	if v == "" {
		return nil, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return nil, fmt.Errorf("invalid %s %q", name, v)
	}
	return &f, nil
}

func validMetadata(m []byte) error {
	if len(m) > MaxMetadataBytes {
		return fmt.Errorf("metadata of %d bytes is larger than %d", len(m), MaxMetadataBytes)
	}
	if !json.Valid(m) {
		return errors.New("metadata is not valid JSON")
	}
	return nil
}
