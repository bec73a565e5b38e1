package tenancy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/internal/strictjson"
)

// maxInactive bounds a tenant consumer's inactivity threshold, so one
// whose reader died goes away.
const maxInactive = 5 * time.Minute

// maxWaiting bounds the pull requests waiting on one tenant reader.
const maxWaiting = 512

// createRequest is the consumer create request a tenant may send: what
// nats.go's OrderedConsumer and a plain pull consumer send, filtered on
// one subject. No deliver subject or group, durable, extra filters,
// metadata, acks or redeliveries: a tenant's reader is an ephemeral pull
// consumer without acks.
type createRequest struct {
	Stream string        `json:"stream_name"`
	Config *readerConfig `json:"config"`
	Action string        `json:"action"`
}

// readerConfig is a tenant reader's config, as decoded and as sent on
// (the proxy sets every field it sends itself).
type readerConfig struct {
	Name              string     `json:"name"`
	DeliverPolicy     string     `json:"deliver_policy"`
	OptStartSeq       uint64     `json:"opt_start_seq,omitempty"`
	OptStartTime      *time.Time `json:"opt_start_time,omitempty"`
	AckPolicy         string     `json:"ack_policy"`
	FilterSubject     string     `json:"filter_subject"`
	ReplayPolicy      string     `json:"replay_policy"`
	MaxWaiting        int        `json:"max_waiting,omitempty"`
	HeadersOnly       bool       `json:"headers_only,omitempty"`
	MaxBatch          int        `json:"max_batch,omitempty"`
	MaxExpires        int64      `json:"max_expires,omitempty"`
	MaxBytes          int        `json:"max_bytes,omitempty"`
	InactiveThreshold int64      `json:"inactive_threshold"`
	Replicas          int        `json:"num_replicas"`
	MemoryStorage     bool       `json:"mem_storage,omitempty"`
}

// ConsumerCreate is a checked consumer create of a tenant: the proxy
// sends Body on Subject, both built here from typed values.
type ConsumerCreate struct {
	Name, Filter string
	cfg          readerConfig
	stream       string
}

// Subject is the JetStream API call (after $JS.API.) that creates it.
func (c *ConsumerCreate) Subject() string {
	return "CONSUMER.CREATE." + c.stream + "." + c.Name + "." + c.Filter
}

// Body is the request body the proxy sends: action "create" (an existing
// consumer, the fleet's own, is never updated).
func (c *ConsumerCreate) Body() []byte {
	cfg := c.cfg
	b, _ := json.Marshal(struct {
		Stream string       `json:"stream_name"`
		Config readerConfig `json:"config"`
		Action string       `json:"action"`
	}{c.stream, cfg, "create"})
	return b
}

// CheckConsumerCreate checks a consumer create request of a tenant whose
// subjects start with own, on stream (the create subject's name and
// filter, filter empty for the form without one; data its body). The
// body is decoded into the fleet's own types: a key that is not
// byte-exactly one a reader may set is refused, whatever encoding/json
// (and so nats-server) would fold it to. The filter must lie within own,
// the name must not be the fleet's, and the inactivity threshold is at
// most 5 minutes.
func CheckConsumerCreate(stream, name, filter, own string, data []byte) (*ConsumerCreate, error) {
	var req createRequest
	if err := strictjson.Decode(data, &req); err != nil {
		return nil, fmt.Errorf("%w: consumer create request: %w", ErrScope, err)
	}
	if req.Config == nil {
		return nil, fmt.Errorf("%w: consumer create request without a config", ErrScope)
	}
	cfg := *req.Config
	switch {
	case req.Stream != "" && req.Stream != stream:
		return nil, fmt.Errorf("%w: the request names stream %q, not %s", ErrScope, req.Stream, stream)
	case req.Action != "" && req.Action != "create" && req.Action != "update":
		return nil, fmt.Errorf("%w: unknown consumer action %q", ErrScope, req.Action)
	case cfg.Name != "" && cfg.Name != name:
		return nil, fmt.Errorf("%w: the consumer's name differs from its create subject's", ErrScope)
	case filter == "":
		filter = cfg.FilterSubject
	case cfg.FilterSubject != "" && cfg.FilterSubject != filter:
		return nil, fmt.Errorf("%w: the consumer's filter differs from its create subject's", ErrScope)
	}
	if err := checkReaderName(name); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(filter, own) || !validSubject(filter, true) {
		return nil, fmt.Errorf("%w: a consumer must filter within %s>", ErrScope, own)
	}
	if err := checkReaderConfig(&cfg); err != nil {
		return nil, err
	}
	cfg.Name, cfg.FilterSubject, cfg.AckPolicy = name, filter, "none"
	cfg.Replicas, cfg.MemoryStorage = 1, true
	if cfg.InactiveThreshold <= 0 || cfg.InactiveThreshold > int64(maxInactive) {
		cfg.InactiveThreshold = int64(maxInactive)
	}
	return &ConsumerCreate{Name: name, Filter: filter, cfg: cfg, stream: stream}, nil
}

// checkReaderConfig checks the enumerations and limits of a reader's config.
func checkReaderConfig(cfg *readerConfig) error {
	oneOf := func(field, v string, allowed ...string) error {
		if slices.Contains(allowed, v) {
			return nil
		}
		return fmt.Errorf("%w: %s %q is not one of %s", ErrScope, field, v, strings.Join(allowed, ", "))
	}
	if cfg.DeliverPolicy == "" {
		cfg.DeliverPolicy = "all"
	}
	if cfg.ReplayPolicy == "" {
		cfg.ReplayPolicy = "instant"
	}
	if err := oneOf("deliver_policy", cfg.DeliverPolicy, "all", "last", "new", "by_start_sequence", "by_start_time", "last_per_subject"); err != nil {
		return err
	}
	if err := oneOf("replay_policy", cfg.ReplayPolicy, "instant", "original"); err != nil {
		return err
	}
	if cfg.AckPolicy != "" && cfg.AckPolicy != "none" {
		return fmt.Errorf("%w: a tenant's reader takes no acks (ack_policy must be none, not %q)", ErrScope, cfg.AckPolicy)
	}
	if cfg.Replicas < 0 || cfg.Replicas > 1 {
		return fmt.Errorf("%w: a tenant's reader has one replica (num_replicas %d)", ErrScope, cfg.Replicas)
	}
	if cfg.MaxWaiting < 0 || cfg.MaxWaiting > maxWaiting || cfg.MaxBatch < 0 || cfg.MaxBytes < 0 || cfg.MaxExpires < 0 {
		return fmt.Errorf("%w: max_waiting (at most %d), max_batch, max_bytes and max_expires must not be negative", ErrScope, maxWaiting)
	}
	return nil
}

// checkReaderName checks a tenant reader's name: one subject token of
// letters, digits, - and _ (as nats.go names them), never one of the
// fleet's durables.
func checkReaderName(name string) error {
	if name == "" || len(name) > 64 || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	}) >= 0 {
		return fmt.Errorf("%w: %q is not a reader's name (1 to 64 letters, digits, - or _)", ErrScope, name)
	}
	if slices.Contains(FleetDurables, name) {
		return fmt.Errorf("%w: %q is the name of one of the fleet's consumers", ErrScope, name)
	}
	return nil
}

// validSubject reports whether s is a NATS subject (a filter when
// wildcards): non-empty tokens of printable ASCII without spaces, * and >
// only as whole tokens, > only last.
func validSubject(s string, wildcards bool) bool {
	if s == "" || len(s) > 512 {
		return false
	}
	tokens := strings.Split(s, ".")
	for i, tok := range tokens {
		switch {
		case tok == "":
			return false
		case tok == "*" || tok == ">":
			if !wildcards || (tok == ">" && i != len(tokens)-1) {
				return false
			}
		case strings.IndexFunc(tok, func(r rune) bool { return r <= ' ' || r > '~' || r == '*' || r == '>' }) >= 0:
			return false
		}
	}
	return true
}

// msgGetRequest is the only message get a tenant may send: the last
// message of one of its subjects.
type msgGetRequest struct {
	LastBySubject string `json:"last_by_subj"`
}

// CheckMsgGet checks a message get request body (decoded into the
// fleet's own type, keys byte-exact): only the last message of a subject
// within own. It returns the body the proxy sends.
func CheckMsgGet(own string, data []byte) ([]byte, error) {
	var req msgGetRequest
	if err := strictjson.Decode(data, &req); err != nil {
		return nil, fmt.Errorf("%w: a tenant may get only the last message of a subject (last_by_subj): %w", ErrScope, err)
	}
	subj := req.LastBySubject
	if !strings.HasPrefix(subj, own) || !validSubject(subj, false) {
		return nil, fmt.Errorf("%w: subject %q is not within %s>", ErrScope, subj, own)
	}
	return json.Marshal(msgGetRequest{LastBySubject: subj})
}

// checkEmpty checks the body of a call that takes none (consumer info and
// delete): empty, or an empty JSON object.
func checkEmpty(call string, data []byte) error {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil
	}
	var none struct{}
	if err := strictjson.Decode(data, &none); err != nil {
		return fmt.Errorf("%w: %s takes no request body: %w", ErrScope, call, err)
	}
	return nil
}
