package s3

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Size limits of S3 and R2.
const (
	// MinPartSize is the smallest multipart part S3 and R2 accept (except the last part).
	MinPartSize = 5 << 20
	// MaxPartSize is the largest multipart part (and the largest single PUT) R2 accepts.
	MaxPartSize = 5000 << 20
	// MaxParts is the most parts one multipart upload may have.
	MaxParts = 10000
	// DefaultPartSize is the part size PutStream uses unless Config.PartSize says otherwise.
	DefaultPartSize = 8 << 20
)

// ErrClosed is returned by every call on a closed Store.
var ErrClosed = errors.New("s3: store closed")

// Config configures a Store. Bucket is required; everything else has a default.
type Config struct {
	// Bucket is the bucket name. Required.
	Bucket string
	// Prefix is prepended (with a '/') to every key, so several fleets can
	// share one bucket. Defaults to "" (keys are object names as they are).
	Prefix string
	// Endpoint is the S3 API base URL, e.g.
	// "https://<account_id>.r2.cloudflarestorage.com". Defaults to "" (AWS's
	// own endpoint for Region).
	Endpoint string
	// Region is the signing region. Defaults to "auto" (what R2 expects).
	Region string
	// Credentials, when set, replaces the default AWS credential chain
	// (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN,
	// AWS_PROFILE, shared files, IMDS). Defaults to nil (the default chain).
	Credentials aws.CredentialsProvider
	// HTTPClient, when set, is the client the SDK sends requests with. It is
	// set on the S3 client options, not through config.WithHTTPClient, which
	// fails when AWS_CA_BUNDLE is set. Defaults to the SDK's client.
	HTTPClient awss3.HTTPClient
	// SkipSharedConfig stops the SDK from reading ~/.aws/config and
	// ~/.aws/credentials, for hermetic tests. Defaults to false.
	SkipSharedConfig bool
	// PartSize is the size of each multipart part PutStream uploads; every
	// part but the last has exactly this size, as R2 requires. It must be
	// between MinPartSize and MaxPartSize. Defaults to DefaultPartSize.
	PartSize int64
	// OpTimeout bounds one request (one Put, Get, List page, part upload…)
	// when the caller's context has no deadline. Defaults to 2 minutes.
	OpTimeout time.Duration
	// MaxAttempts is how many times the SDK tries one request (throttling,
	// 5xx and transport errors are retried with backoff). Defaults to the
	// SDK's default (3).
	MaxAttempts int
	// ListPageSize is the number of keys asked for per ListObjectsV2 page.
	// Defaults to 1000 (the S3 maximum).
	ListPageSize int32
	// Logger receives abort warnings and skipped-object notes. Defaults to a
	// no-op logger.
	Logger *zerolog.Logger
}

func (c Config) withDefaults() Config {
	c.Region = cmp.Or(c.Region, "auto")
	c.PartSize = cmp.Or(c.PartSize, DefaultPartSize)
	c.OpTimeout = cmp.Or(c.OpTimeout, 2*time.Minute)
	c.ListPageSize = cmp.Or(c.ListPageSize, 1000)
	c.Prefix = strings.Trim(c.Prefix, "/")
	return c
}

func (c Config) validate() error {
	if c.Bucket == "" {
		return errors.New("s3: Bucket is required")
	}
	if c.PartSize < MinPartSize || c.PartSize > MaxPartSize {
		return fmt.Errorf("s3: PartSize must be between %d and %d bytes, got %d", MinPartSize, MaxPartSize, c.PartSize)
	}
	if c.Prefix != "" {
		if err := storage.ValidateKey(c.Prefix); err != nil {
			return fmt.Errorf("s3: Prefix %q: %w", c.Prefix, err)
		}
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("s3: Endpoint %q is not an http(s) URL", c.Endpoint)
		}
	}
	if c.MaxAttempts < 0 {
		return fmt.Errorf("s3: MaxAttempts must not be negative, got %d", c.MaxAttempts)
	}
	if c.ListPageSize < 1 || c.ListPageSize > 1000 {
		return fmt.Errorf("s3: ListPageSize must be between 1 and 1000, got %d", c.ListPageSize)
	}
	if c.OpTimeout < 0 {
		return fmt.Errorf("s3: OpTimeout must not be negative, got %s", c.OpTimeout)
	}
	return nil
}

// Store is a storage.Store on one S3 bucket (Cloudflare R2 or any
// S3-compatible service). It implements storage.Creator (conditional PUT
// with If-None-Match: *) and storage.StreamPutter (multipart upload). It is
// safe for concurrent use.
type Store struct {
	client   *awss3.Client
	bucket   string
	prefix   string // "" or ends with '/'
	partSize int64
	pageSize int32
	timeout  time.Duration
	log      zerolog.Logger
	closed   atomic.Bool
}

var (
	_ storage.Store        = (*Store)(nil)
	_ storage.Creator      = (*Store)(nil)
	_ storage.StreamPutter = (*Store)(nil)
)

// Open returns a Store for a URL of the form
//
//	s3://<bucket>[/<prefix>][?endpoint=<S3 API base URL>&region=<region>]
//
// Credentials come from the standard AWS environment (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_PROFILE, …). region defaults to "auto".
// Unknown query parameters are an error, so a typo does not go unnoticed.
func Open(ctx context.Context, u *url.URL) (storage.Store, error) {
	cfg, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	return New(ctx, cfg)
}

// ParseURL turns an s3:// URL (see Open) into a Config.
func ParseURL(u *url.URL) (Config, error) {
	if u == nil || u.Scheme != "s3" {
		return Config{}, fmt.Errorf("s3: URL must have the s3 scheme")
	}
	if u.User != nil {
		return Config{}, errors.New("s3: credentials do not belong in the URL; use the AWS environment")
	}
	if u.Host == "" {
		return Config{}, fmt.Errorf("s3: URL %q has no bucket", u.Redacted())
	}
	q := u.Query()
	for k := range q {
		if k != "endpoint" && k != "region" {
			return Config{}, fmt.Errorf("s3: unknown URL parameter %q (known: endpoint, region)", k)
		}
	}
	return Config{
		Bucket:   u.Host,
		Prefix:   strings.Trim(u.Path, "/"),
		Endpoint: q.Get("endpoint"),
		Region:   q.Get("region"),
	}, nil
}

// New returns a Store for cfg. It loads the AWS configuration (credentials,
// retry settings) but sends no request.
func New(ctx context.Context, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	opts := []func(*config.LoadOptions) error{
		config.WithRegion(cfg.Region),
		// Both WhenRequired: the defaults of aws-sdk-go-v2 since 2025-01 add
		// x-amz-checksum-crc32 (and aws-chunked trailers on unseekable
		// bodies) that R2 and other S3-compatible stores reject.
		config.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	}
	if cfg.Credentials != nil {
		opts = append(opts, config.WithCredentialsProvider(cfg.Credentials))
	}
	if cfg.MaxAttempts > 0 {
		opts = append(opts, config.WithRetryMaxAttempts(cfg.MaxAttempts))
	}
	if cfg.SkipSharedConfig {
		opts = append(opts, config.WithSharedConfigFiles([]string{}), config.WithSharedCredentialsFiles([]string{}))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("s3: load AWS config: %w", err)
	}
	client := awss3.NewFromConfig(awsCfg, func(o *awss3.Options) {
		o.UsePathStyle = true
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		if cfg.HTTPClient != nil {
			o.HTTPClient = cfg.HTTPClient
		}
	})
	log := zerolog.Nop()
	if cfg.Logger != nil {
		log = *cfg.Logger
	}
	prefix := ""
	if cfg.Prefix != "" {
		prefix = cfg.Prefix + "/"
	}
	return &Store{
		client:   client,
		bucket:   cfg.Bucket,
		prefix:   prefix,
		partSize: cfg.PartSize,
		pageSize: cfg.ListPageSize,
		timeout:  cfg.OpTimeout,
		log:      log.With().Str("component", "storage.s3").Str("bucket", cfg.Bucket).Logger(),
	}, nil
}

// begin checks the store, the context and the key before an operation.
func (s *Store) begin(ctx context.Context, op, key string) error {
	if s.closed.Load() {
		return fmt.Errorf("s3: %s %q: %w", op, key, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("s3: %s %q: %w", op, key, err)
	}
	if err := storage.ValidateKey(key); err != nil {
		return fmt.Errorf("s3: %s: %w", op, err)
	}
	return nil
}

// opCtx applies the default per-request timeout when ctx has no deadline.
func (s *Store) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || s.timeout == 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

func (s *Store) object(key string) string { return s.prefix + key }

// Put implements storage.Store. Values larger than one part go through
// PutStream's multipart path.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	if err := s.begin(ctx, "put", key); err != nil {
		return err
	}
	if int64(len(value)) > s.partSize {
		return s.putStream(ctx, key, bytes.NewReader(value))
	}
	return s.putObject(ctx, "put", key, value, false)
}

// Create implements storage.Creator with a conditional PUT
// (If-None-Match: *). S3, R2 and gofakes3 answer 412 PreconditionFailed when
// the object exists; that becomes an error wrapping storage.ErrExists.
func (s *Store) Create(ctx context.Context, key string, value []byte) error {
	if err := s.begin(ctx, "create", key); err != nil {
		return err
	}
	if int64(len(value)) > MaxPartSize {
		return fmt.Errorf("s3: create %q: %d bytes: %w", key, len(value), storage.ErrTooLarge)
	}
	return s.putObject(ctx, "create", key, value, true)
}

// putObject sends one PutObject with a seekable body, so the SDK never
// falls back to aws-chunked streaming.
func (s *Store) putObject(ctx context.Context, op, key string, value []byte, ifNoneMatch bool) error {
	in := &awss3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           aws.String(s.object(key)),
		Body:          bytes.NewReader(value),
		ContentLength: aws.Int64(int64(len(value))),
	}
	if ifNoneMatch {
		in.IfNoneMatch = aws.String("*")
	}
	// A concurrent conditional write of the same key can make S3 answer 409
	// ConditionalRequestConflict; the retry then sees 412 or succeeds.
	for attempt := 0; ; attempt++ {
		rctx, cancel := s.opCtx(ctx)
		_, err := s.client.PutObject(rctx, in)
		cancel()
		if err == nil {
			return nil
		}
		if ifNoneMatch && attempt < 4 && apiCode(err) == "ConditionalRequestConflict" {
			if werr := sleepCtx(ctx, time.Duration(50<<attempt)*time.Millisecond); werr != nil {
				return fmt.Errorf("s3: %s %q: %w", op, key, werr)
			}
			_, _ = in.Body.(*bytes.Reader).Seek(0, io.SeekStart)
			continue
		}
		return s.wrap(op, key, err)
	}
}

// Get implements storage.Store.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := s.begin(ctx, "get", key); err != nil {
		return nil, err
	}
	rctx, cancel := s.opCtx(ctx)
	defer cancel()
	out, err := s.client.GetObject(rctx, &awss3.GetObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(s.object(key)),
	})
	if err != nil {
		return nil, s.wrap("get", key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, fmt.Errorf("s3: get %q: read body: %w: %w", key, storage.ErrUnavailable, err)
	}
	if out.ContentLength != nil && *out.ContentLength != int64(len(b)) {
		return nil, fmt.Errorf("s3: get %q: got %d of %d bytes: %w", key, len(b), *out.ContentLength, storage.ErrUnavailable)
	}
	return b, nil
}

// List implements storage.Store. It pages through ListObjectsV2; object
// names under the store's prefix that are not valid keys are skipped.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("s3: list %q: %w", prefix, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("s3: list %q: %w", prefix, err)
	}
	p := awss3.NewListObjectsV2Paginator(s.client, &awss3.ListObjectsV2Input{
		Bucket:  aws.String(s.bucket),
		Prefix:  aws.String(s.object(prefix)),
		MaxKeys: aws.Int32(s.pageSize),
	})
	keys := []string{}
	for p.HasMorePages() {
		rctx, cancel := s.opCtx(ctx)
		page, err := p.NextPage(rctx)
		cancel()
		if err != nil {
			return nil, s.wrap("list", prefix, err)
		}
		for _, o := range page.Contents {
			name, ok := strings.CutPrefix(aws.ToString(o.Key), s.prefix)
			if !ok || storage.ValidateKey(name) != nil {
				s.log.Debug().Str("object", aws.ToString(o.Key)).Msg("list: skipping object that is not a valid key")
				continue
			}
			keys = append(keys, name)
		}
	}
	slices.Sort(keys)
	return keys, nil
}

// Delete implements storage.Store. S3 deletes are idempotent.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.begin(ctx, "delete", key); err != nil {
		return err
	}
	rctx, cancel := s.opCtx(ctx)
	defer cancel()
	_, err := s.client.DeleteObject(rctx, &awss3.DeleteObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(s.object(key)),
	})
	if err != nil {
		if werr := s.wrap("delete", key, err); !errors.Is(werr, storage.ErrNotFound) {
			return werr
		}
	}
	return nil
}

// Close implements storage.Store. Later calls fail with ErrClosed; closing
// twice is fine.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

// wrap turns an SDK error into one wrapping the storage sentinels:
// 404/NoSuchKey → ErrNotFound, 412 → ErrExists, 413/EntityTooLarge →
// ErrTooLarge, 5xx, 429/SlowDown and transport failures → ErrUnavailable.
// Context errors stay as they are (still wrapped).
func (s *Store) wrap(op, key string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("s3: %s %q: %w", op, key, err)
	}
	var sentinel error
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	status := httpStatus(err)
	code := apiCode(err)
	switch {
	case errors.As(err, &nsk), errors.As(err, &nf), status == http.StatusNotFound && code != "NoSuchBucket":
		sentinel = storage.ErrNotFound
	case status == http.StatusPreconditionFailed, code == "PreconditionFailed":
		sentinel = storage.ErrExists
	case status == http.StatusRequestEntityTooLarge, code == "EntityTooLarge":
		sentinel = storage.ErrTooLarge
	case status >= 500, status == http.StatusTooManyRequests, code == "SlowDown", status == 0:
		sentinel = storage.ErrUnavailable
	}
	if sentinel == nil {
		return fmt.Errorf("s3: %s %q: %w", op, key, err)
	}
	return fmt.Errorf("s3: %s %q: %w: %w", op, key, sentinel, err)
}

// httpStatus returns the HTTP status of an SDK error, 0 when there was no
// response (a transport failure).
func httpStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// apiCode returns the S3 error code of an SDK error ("" when none).
func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
