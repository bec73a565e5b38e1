package backends

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/natsstore"
)

// Role is what a store is opened for.
type Role int

// Roles.
const (
	// Objects holds transcripts, journal chunks and large lines.
	Objects Role = iota + 1
	// Status holds one status record per query.
	Status
)

// String returns "objects" or "status".
func (r Role) String() string {
	switch r {
	case Objects:
		return "objects"
	case Status:
		return "status"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// Deps is what backends may need besides the URL.
type Deps struct {
	// JS is the fleet's JetStream context, required by nats://.
	JS jetstream.JetStream
	// StatusBucket is the KV bucket of nats:// for the Status role
	// (default protocol.NewNames("").StatusBucket(), FLEET_STATUS).
	StatusBucket string
	// ObjectBucket is the Object Store bucket of nats:// for the Objects
	// role (default protocol.NewNames("").ObjectBucket(), FLEET_TRANSCRIPTS).
	ObjectBucket string
	// Replicas of the nats:// buckets: a bucket is created with them and
	// an existing one with fewer is raised to them (natsstore.WithReplicas).
	// 0 means 1, which raises nothing. The URL's ?replicas= overrides it.
	// The dispatcher passes its --replicas, so on a cluster the storage
	// buckets survive the loss of a node as the fleet's streams do.
	Replicas int
	// Logger receives one line per opened store; nil logs nothing.
	Logger *zerolog.Logger
}

// OpenFunc opens a store for one URL scheme. u is the parsed URL; role and
// deps are passed through from Open.
type OpenFunc func(ctx context.Context, u *url.URL, role Role, deps Deps) (storage.Store, error)

var (
	mu      sync.RWMutex
	openers = map[string]OpenFunc{}
)

func init() {
	Register("file", openFile)
	Register("nats", openNATS)
}

// Register makes a scheme ("s3", "cfkv") available to Open. It panics if fn
// is nil or the scheme is already registered, like database/sql.Register:
// both are programming errors found at start-up.
func Register(scheme string, fn OpenFunc) {
	scheme = strings.ToLower(scheme)
	if fn == nil {
		panic("backends: Register " + scheme + " with a nil OpenFunc")
	}
	mu.Lock()
	defer mu.Unlock()
	if _, dup := openers[scheme]; dup {
		panic("backends: scheme " + scheme + " registered twice")
	}
	openers[scheme] = fn
}

// Schemes returns the registered schemes, sorted.
func Schemes() []string {
	mu.RLock()
	defer mu.RUnlock()
	return slices.Sorted(maps.Keys(openers))
}

// Open parses rawURL and opens the store its scheme names, for role.
func Open(ctx context.Context, rawURL string, role Role, deps Deps) (storage.Store, error) {
	if role != Objects && role != Status {
		return nil, fmt.Errorf("storage: open %s: invalid role %d", redact(rawURL), int(role))
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error repeats the whole URL, which may hold a password.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("storage: open %s store: bad URL: %w", role, err)
	}
	scheme := strings.ToLower(u.Scheme)
	mu.RLock()
	fn, ok := openers[scheme]
	mu.RUnlock()
	if !ok {
		if scheme == "" {
			return nil, fmt.Errorf("storage: open %s store: %q has no scheme; use file:///abs/dir or file://./rel/dir for a directory (known schemes: %s)",
				role, redact(rawURL), strings.Join(Schemes(), ", "))
		}
		return nil, fmt.Errorf("storage: open %s store: unknown scheme %q in %s (known schemes: %s; s3 and cfkv are available when the binary registers them)",
			role, scheme, redact(rawURL), strings.Join(Schemes(), ", "))
	}
	s, err := fn(ctx, u, role, deps)
	if err != nil {
		return nil, fmt.Errorf("storage: open %s store %s: %w", role, redact(rawURL), err)
	}
	if deps.Logger != nil {
		deps.Logger.Info().Str("component", "storage").Str("role", role.String()).
			Str("scheme", scheme).Msg("storage opened")
	}
	return s, nil
}

// OpenBoth opens the Objects store from objectsURL and the Status store from
// statusURL; an empty statusURL means objectsURL (--status-storage defaults
// to --storage). If the second open fails, the first store is closed.
func OpenBoth(ctx context.Context, objectsURL, statusURL string, deps Deps) (objects, status storage.Store, err error) {
	if statusURL == "" {
		statusURL = objectsURL
	}
	objects, err = Open(ctx, objectsURL, Objects, deps)
	if err != nil {
		return nil, nil, err
	}
	status, err = Open(ctx, statusURL, Status, deps)
	if err != nil {
		return nil, nil, errors.Join(err, objects.Close())
	}
	return objects, status, nil
}

// redact hides a password in rawURL for error messages.
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			return u.Redacted()
		}
	}
	return rawURL
}

// FilePath returns the directory a file:// URL names: file:///abs → /abs,
// file://./rel and file://rel/dir → relative to the working directory,
// file://localhost/abs → /abs, file:rel → rel.
func FilePath(u *url.URL) (string, error) {
	var p string
	switch {
	case u.Opaque != "":
		p = u.Opaque
	case u.Host == "" || u.Host == "localhost":
		p = u.Path
	default:
		p = u.Host + u.Path
	}
	if p == "" {
		return "", errors.New("file:// URL names no directory (use file://./data or file:///var/lib/fleet)")
	}
	if u.RawQuery != "" {
		return "", fmt.Errorf("file:// URL takes no query (got ?%s)", u.RawQuery)
	}
	return filepath.Clean(p), nil
}

func openFile(_ context.Context, u *url.URL, _ Role, _ Deps) (storage.Store, error) {
	dir, err := FilePath(u)
	if err != nil {
		return nil, err
	}
	return storage.NewFS(dir)
}

func openNATS(ctx context.Context, u *url.URL, role Role, deps Deps) (storage.Store, error) {
	if u.Host != "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("nats:// storage uses the fleet's own NATS connection (--nats-url); write nats:// or nats://?bucket=NAME, not %s", u.Redacted())
	}
	q := u.Query()
	for k := range q {
		if k != "bucket" && k != "replicas" {
			return nil, fmt.Errorf("nats:// storage: unknown query parameter %q (only bucket and replicas)", k)
		}
	}
	replicas := max(deps.Replicas, 1)
	if v := q.Get("replicas"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 5 {
			return nil, fmt.Errorf("nats:// storage: replicas=%q: want a number from 1 to 5", v)
		}
		replicas = n
	}
	if deps.JS == nil {
		return nil, errors.New("nats:// storage needs a JetStream connection")
	}
	names := protocol.NewNames("")
	switch role {
	case Status:
		bucket := cmp.Or(q.Get("bucket"), deps.StatusBucket, names.StatusBucket())
		return natsstore.NewKV(ctx, deps.JS, bucket, natsstore.WithReplicas(replicas))
	default:
		bucket := cmp.Or(q.Get("bucket"), deps.ObjectBucket, names.ObjectBucket())
		return natsstore.NewObjects(ctx, deps.JS, bucket, natsstore.WithReplicas(replicas))
	}
}
