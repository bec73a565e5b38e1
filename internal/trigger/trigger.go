package trigger

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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
	ErrNotFound = errors.New("no such trigger")
	ErrExists   = errors.New("a trigger of that name exists")
	ErrTemplate = errors.New("invalid template")
)

// Definition is a trigger as stored.
type Definition struct {
	V        int             `json:"v"`
	Tenant   string          `json:"tenant"`
	Name     string          `json:"name"`
	Secret   string          `json:"secret"`
	Template json.RawMessage `json:"template"`
	Created  time.Time       `json:"created"`
}

// Path is where the trigger is posted to, below the dispatcher's --http
// address.
func Path(tenant, name string) string { return "/v1/triggers/" + tenant + "/" + name }

// Store keeps triggers in the KV bucket <PREFIX>_TRIGGERS.
type Store struct {
	js       jetstream.JetStream
	bucket   string
	replicas int
	kv       jetstream.KeyValue
}

// NewStore returns a Store on js; Open (or Ensure) before use.
func NewStore(js jetstream.JetStream, names protocol.Names, replicas int) *Store {
	return &Store{js: js, bucket: strings.TrimSuffix(names.StatusBucket(), "_STATUS") + "_TRIGGERS", replicas: max(replicas, 1)}
}

// Ensure creates the bucket when missing and opens it.
func (s *Store) Ensure(ctx context.Context) error {
	kv, err := provision.KeyValue(ctx, s.js, jetstream.KeyValueConfig{Bucket: s.bucket, Description: "agentfleet inbound webhook triggers",
		History: 1, Replicas: s.replicas, Storage: jetstream.FileStorage})
	if err != nil {
		return fmt.Errorf("trigger: the %s bucket: %w", s.bucket, err)
	}
	s.kv = kv
	return nil
}

func key(tenant, name string) string { return tenant + "." + name }

// Add stores a new trigger with a fresh secret, its template checked.
func (s *Store) Add(ctx context.Context, tenant, name string, tmpl json.RawMessage) (Definition, error) {
	if _, err := Render(tmpl, tenant, sampleFields(tmpl)); err != nil {
		return Definition{}, err
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return Definition{}, err
	}
	def := Definition{V: 1, Tenant: tenant, Name: name, Secret: "whsec_" + base64.StdEncoding.EncodeToString(b),
		Template: tmpl, Created: time.Now().UTC()}
	body, err := json.Marshal(def)
	if err != nil {
		return Definition{}, err
	}
	if _, err := s.kv.Create(ctx, key(tenant, name), body); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return Definition{}, fmt.Errorf("%w: %s (remove it first)", ErrExists, name)
		}
		return Definition{}, err
	}
	return def, nil
}

// Get returns a trigger.
func (s *Store) Get(ctx context.Context, tenant, name string) (Definition, error) {
	var def Definition
	e, err := s.kv.Get(ctx, key(tenant, name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return def, fmt.Errorf("%w: %s/%s", ErrNotFound, tenant, name)
	}
	if err != nil {
		return def, err
	}
	return def, json.Unmarshal(e.Value(), &def)
}

// Remove deletes a trigger.
func (s *Store) Remove(ctx context.Context, tenant, name string) error {
	if _, err := s.Get(ctx, tenant, name); err != nil {
		return err
	}
	return s.kv.Purge(ctx, key(tenant, name))
}

// List returns tenant's triggers ("" every tenant's), secrets left out.
func (s *Store) List(ctx context.Context, tenant string) ([]Definition, error) {
	filter := ">"
	if tenant != "" {
		filter = tenant + ".*"
	}
	lister, err := s.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, err
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := []Definition{}
	for _, k := range keys {
		t, n, _ := strings.Cut(k, ".")
		def, err := s.Get(ctx, t, n)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		def.Secret = ""
		out = append(out, def)
	}
	return out, nil
}

// JobID is the id of the job a delivery with webhookID starts.
func JobID(name, webhookID string) string {
	sum := sha256.Sum256([]byte(webhookID))
	return name + "-" + hex.EncodeToString(sum[:8])
}

// Render fills tmpl's placeholders from fields and returns the job,
// decoded strictly (unknown fields refused) and validated, for tenant.
func Render(tmpl json.RawMessage, tenant string, fields map[string]any) (*protocol.Job, error) {
	var doc any
	dec := json.NewDecoder(bytes.NewReader(tmpl))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: not JSON: %w", ErrTemplate, err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, fmt.Errorf("%w: must be a JSON object (a job)", ErrTemplate)
	}
	vals := map[string]string{}
	for k, v := range fields {
		if s, ok := v.(string); ok {
			vals[k] = s
			continue
		}
		b, _ := json.Marshal(v)
		vals[k] = string(b)
	}
	filled, err := fill(doc, vals, "")
	if err != nil {
		return nil, err
	}
	out, err := json.Marshal(filled)
	if err != nil {
		return nil, err
	}
	var job protocol.Job
	jd := json.NewDecoder(bytes.NewReader(out))
	jd.DisallowUnknownFields()
	if err := jd.Decode(&job); err != nil {
		return nil, fmt.Errorf("%w: not a job: %w", ErrTemplate, err)
	}
	if job.ID != "" || job.Trigger != nil {
		return nil, fmt.Errorf("%w: id and trigger are set per delivery; leave them out", ErrTemplate)
	}
	if job.Tenant != "" && job.Tenant != tenant {
		return nil, fmt.Errorf("%w: tenant must be the trigger's", ErrTemplate)
	}
	job.Tenant = tenant
	probe := job
	probe.ID = "probe"
	if err := probe.Validate("", true); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	if err := protocol.RefuseToken(&probe); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	return &job, nil
}

// fill executes the template in every string of v (keys are left as
// they are), with missing fields empty.
func fill(v any, vals map[string]string, path string) (any, error) {
	switch x := v.(type) {
	case string:
		if !strings.Contains(x, "{{") {
			return x, nil
		}
		t, err := template.New(path).Option("missingkey=zero").Parse(x)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrTemplate, path, err)
		}
		var b strings.Builder
		if err := t.Execute(&b, vals); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrTemplate, path, err)
		}
		return b.String(), nil
	case map[string]any:
		for k, e := range x {
			f, err := fill(e, vals, path+"."+k)
			if err != nil {
				return nil, err
			}
			x[k] = f
		}
	case []any:
		for i, e := range x {
			f, err := fill(e, vals, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			x[i] = f
		}
	}
	return v, nil
}
