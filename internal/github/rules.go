package github

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"text/template"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Errors of the Store.
var (
	ErrNotFound = errors.New("no rule for that repository")
	ErrExists   = errors.New("the repository has a rule")
	ErrInvalid  = errors.New("invalid rule")
)

// Rule says which tenant a repository's events start jobs for, and which
// events do.
type Rule struct {
	V      int    `json:"v"`
	Tenant string `json:"tenant"`
	// Repo is "owner/name" as given at add; matched case-insensitively.
	Repo string `json:"repo"`
	// Handle is the app's login without "[bot]": a comment mentioning
	// @Handle starts a job, and an issue assigned to it does (Assign).
	Handle string `json:"handle,omitempty"`
	// Label starts a job when an issue is labeled with it.
	Label  string `json:"label,omitempty"`
	Assign bool   `json:"assign,omitempty"`
	// PromptTemplate is a text/template over PromptData; "" is
	// DefaultPromptTemplate.
	PromptTemplate string `json:"prompt_template,omitempty"`
	// Base is the branch the work starts from; "" the repository's default.
	Base    string    `json:"base,omitempty"`
	Created time.Time `json:"created"`
	// LastError is the last failure to report back to GitHub for this
	// repository's jobs (after retries), and when.
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

// DefaultPromptTemplate is the prompt of a rule without a template.
const DefaultPromptTemplate = `You are working on {{ .Repo }}#{{ .Number }}: {{ .Title }}
{{ .URL }}

{{ .Body }}
{{ if .Comment }}
@{{ .Author }} asks:
{{ .Comment }}
{{ end }}`

// PromptData is what a prompt template sees.
type PromptData struct {
	Title, Body, Comment, URL, Repo, Author string
	Number                                  int
}

// Prompt renders the rule's prompt for d.
func (r Rule) Prompt(d PromptData) (string, error) {
	src := r.PromptTemplate
	if src == "" {
		src = DefaultPromptTemplate
	}
	t, err := template.New("prompt").Option("missingkey=error").Parse(src)
	if err != nil {
		return "", fmt.Errorf("%w: prompt template: %w", ErrInvalid, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, d); err != nil {
		return "", fmt.Errorf("%w: prompt template: %w", ErrInvalid, err)
	}
	return strings.TrimSpace(b.String()), nil
}

var (
	repoRE   = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$`)
	handleRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$`)
)

// ValidRepo reports whether s is "owner/name".
func ValidRepo(s string) bool {
	return repoRE.MatchString(s) && !strings.Contains(s, "..") && !strings.HasSuffix(s, ".")
}

// Check validates a rule as added.
func (r Rule) Check() error {
	switch {
	case !protocol.ValidTenant(r.Tenant):
		return fmt.Errorf("%w: tenant: must match %s", ErrInvalid, protocol.TenantPattern)
	case !ValidRepo(r.Repo):
		return fmt.Errorf("%w: repo: must be OWNER/NAME, got %q", ErrInvalid, r.Repo)
	case r.Handle != "" && !handleRE.MatchString(r.Handle):
		return fmt.Errorf("%w: handle: must be a GitHub login (without @ or [bot]), got %q", ErrInvalid, r.Handle)
	case r.Handle == "" && r.Label == "":
		return fmt.Errorf("%w: give --handle (mentions, and --assign) or --label: the rule starts nothing", ErrInvalid)
	case r.Assign && r.Handle == "":
		return fmt.Errorf("%w: assign: needs --handle (the app's login)", ErrInvalid)
	case len(r.Label) > 100 || len(r.PromptTemplate) > 16<<10:
		return fmt.Errorf("%w: label at most 100 bytes, prompt template at most 16 KiB", ErrInvalid)
	}
	if r.Base != "" {
		probe := protocol.Workspace{Repo: "https://example.com/r.git", Ref: r.Base}
		if err := (&protocol.Job{ID: "p", Prompt: "p", Workspace: &probe}).Validate("", true); err != nil {
			return fmt.Errorf("%w: base: %w", ErrInvalid, err)
		}
	}
	_, err := r.Prompt(PromptData{Title: "t", Body: "b", Comment: "c", URL: "u", Repo: r.Repo, Author: "a", Number: 1})
	return err
}

// Store keeps rules in the KV bucket <PREFIX>_GITHUB.
type Store struct {
	js       jetstream.JetStream
	bucket   string
	replicas int
	kv       jetstream.KeyValue
}

// NewStore returns a Store on js; Ensure before use.
func NewStore(js jetstream.JetStream, names protocol.Names, replicas int) *Store {
	return &Store{js: js, bucket: strings.TrimSuffix(names.StatusBucket(), "_STATUS") + "_GITHUB", replicas: max(replicas, 1)}
}

// Ensure creates the bucket when missing and opens it.
func (s *Store) Ensure(ctx context.Context) error {
	kv, err := provision.KeyValue(ctx, s.js, jetstream.KeyValueConfig{Bucket: s.bucket, Description: "agentfleet GitHub rules",
		History: 1, Replicas: s.replicas, Storage: jetstream.FileStorage})
	if err != nil {
		return fmt.Errorf("github: the %s bucket: %w", s.bucket, err)
	}
	s.kv = kv
	return nil
}

func key(repo string) string { return strings.ToLower(repo) }

// Add stores a new rule (checked).
func (s *Store) Add(ctx context.Context, r Rule) (Rule, error) {
	r.V, r.Created, r.LastError, r.LastErrorAt = 1, time.Now().UTC(), "", nil
	if err := r.Check(); err != nil {
		return Rule{}, err
	}
	body, _ := json.Marshal(r)
	if _, err := s.kv.Create(ctx, key(r.Repo), body); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return Rule{}, fmt.Errorf("%w: %s (remove it first)", ErrExists, r.Repo)
		}
		return Rule{}, err
	}
	return r, nil
}

// Get returns the rule of repo ("owner/name", any case).
func (s *Store) Get(ctx context.Context, repo string) (Rule, error) {
	var r Rule
	if !ValidRepo(repo) {
		return r, fmt.Errorf("%w: %s", ErrNotFound, repo)
	}
	e, err := s.kv.Get(ctx, key(repo))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return r, fmt.Errorf("%w: %s", ErrNotFound, repo)
	}
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(e.Value(), &r)
}

// Remove deletes tenant's rule of repo.
func (s *Store) Remove(ctx context.Context, tenant, repo string) error {
	r, err := s.Get(ctx, repo)
	if err != nil {
		return err
	}
	if r.Tenant != tenant {
		return fmt.Errorf("%w: %s", ErrNotFound, repo)
	}
	return s.kv.Purge(ctx, key(repo))
}

// List returns tenant's rules ("" every tenant's).
func (s *Store) List(ctx context.Context, tenant string) ([]Rule, error) {
	lister, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := []Rule{}
	for _, k := range keys {
		r, err := s.Get(ctx, k)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if tenant == "" || r.Tenant == tenant {
			out = append(out, r)
		}
	}
	return out, nil
}

// RecordFailure keeps a failure to report back on repo's rule, for ls.
func (s *Store) RecordFailure(ctx context.Context, repo, msg string) error {
	e, err := s.kv.Get(ctx, key(repo))
	if err != nil {
		return err
	}
	var r Rule
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return err
	}
	now := time.Now().UTC()
	r.LastError, r.LastErrorAt = msg, &now
	body, _ := json.Marshal(r)
	_, err = s.kv.Update(ctx, key(repo), body, e.Revision())
	return err
}

// Request is a request on <prefix>.api.github.
type Request struct {
	Action string `json:"action"` // add, ls, rm
	Tenant string `json:"tenant,omitempty"`
	Repo   string `json:"repo,omitempty"`
	// Rule is the rule to add (its tenant and repo are the request's).
	Rule *Rule `json:"rule,omitempty"`
}

// Reply answers a Request.
type Reply struct {
	Rules []Rule              `json:"rules,omitempty"`
	Error *protocol.ErrorInfo `json:"error,omitempty"`
}

// Subject is the subject of GitHub rule requests.
func Subject(n protocol.Names) string { return n.Prefix() + ".api.github" }
