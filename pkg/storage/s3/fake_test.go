package s3

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

const testBucket = "fleet-test"

// fakeS3 is an in-process gofakes3 server (memory backend) behind a guard
// that rejects, and reports, every request R2 would reject because of the
// aws-sdk-go-v2 checksum defaults: x-amz-checksum-* and
// x-amz-sdk-checksum-algorithm headers, aws-chunked content encoding,
// x-amz-decoded-content-length, x-amz-trailer and STREAMING-* payload
// signatures. gofakes3 itself would silently store aws-chunked framing as
// the object body, so without the guard such a bug would corrupt data
// instead of failing.
//
// gofakes3 v1.2.0 implements If-None-Match: * on PutObject itself (412
// PreconditionFailed when the object exists, checked under its backend
// lock), so the guard does not emulate conditional writes.
type fakeS3 struct {
	srv     *httptest.Server
	backend *s3mem.Backend

	mu       sync.Mutex
	requests []recorded
	// failIf, when set, makes the guard answer 503 to requests it returns true for.
	failIf func(r *http.Request) bool
}

// recorded is what the guard saw of one request.
type recorded struct {
	Method        string
	Path          string
	Query         string
	ContentLength int64
	IfNoneMatch   string
}

// op names the S3 operation of a recorded request (only those the tests count).
func (r recorded) op() string {
	q := r.Query
	switch {
	case r.Method == http.MethodPost && strings.Contains(q, "uploads"):
		return "CreateMultipartUpload"
	case r.Method == http.MethodPut && strings.Contains(q, "partNumber="):
		return "UploadPart"
	case r.Method == http.MethodPost && strings.Contains(q, "uploadId="):
		return "CompleteMultipartUpload"
	case r.Method == http.MethodDelete && strings.Contains(q, "uploadId="):
		return "AbortMultipartUpload"
	case r.Method == http.MethodPut:
		return "PutObject"
	case r.Method == http.MethodGet && strings.Contains(q, "list-type=2"):
		return "ListObjectsV2"
	case r.Method == http.MethodGet:
		return "GetObject"
	case r.Method == http.MethodDelete:
		return "DeleteObject"
	}
	return r.Method
}

// r2Violation returns why R2 would reject r, or "" when it would not.
func r2Violation(r *http.Request) string {
	for name, vals := range r.Header {
		lower := strings.ToLower(name)
		switch {
		case strings.HasPrefix(lower, "x-amz-checksum-"):
			return "header " + name
		case lower == "x-amz-sdk-checksum-algorithm", lower == "x-amz-decoded-content-length", lower == "x-amz-trailer":
			return "header " + name
		case lower == "content-encoding" && strings.Contains(strings.ToLower(strings.Join(vals, ",")), "aws-chunked"):
			return "Content-Encoding: aws-chunked"
		case lower == "x-amz-content-sha256" && strings.HasPrefix(strings.ToUpper(strings.Join(vals, ",")), "STREAMING-"):
			return "x-amz-content-sha256: " + strings.Join(vals, ",")
		}
	}
	return ""
}

// newFakeS3 starts the guarded fake. onViolation is called for every
// request R2 would reject; nil means "fail the test".
func newFakeS3(t *testing.T, onViolation func(string)) *fakeS3 {
	t.Helper()
	if onViolation == nil {
		onViolation = func(v string) { t.Errorf("request R2 would reject: %s", v) }
	}
	f := &fakeS3{backend: s3mem.New()}
	require.NoError(t, f.backend.CreateBucket(testBucket))
	inner := gofakes3.New(f.backend).Server()
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r2Violation(r); v != "" {
			onViolation(fmt.Sprintf("%s %s: %s", r.Method, r.URL.RequestURI(), v))
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidRequest</Code><Message>%s not supported</Message></Error>`, v)
			return
		}
		rec := recorded{
			Method:        r.Method,
			Path:          r.URL.Path,
			Query:         r.URL.RawQuery,
			ContentLength: r.ContentLength,
			IfNoneMatch:   r.Header.Get("If-None-Match"),
		}
		f.mu.Lock()
		f.requests = append(f.requests, rec)
		fail := f.failIf != nil && f.failIf(r)
		f.mu.Unlock()
		if fail {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>`)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// setFailIf installs (or clears, with nil) the failure injector.
func (f *fakeS3) setFailIf(fn func(r *http.Request) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failIf = fn
}

// ops returns the operation names of the recorded requests, in order.
func (f *fakeS3) ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.requests))
	for i, r := range f.requests {
		out[i] = r.op()
	}
	return out
}

// byOp returns the recorded requests of one operation.
func (f *fakeS3) byOp(op string) []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []recorded
	for _, r := range f.requests {
		if r.op() == op {
			out = append(out, r)
		}
	}
	return out
}

// config returns a hermetic Config for the fake: static credentials, no
// shared files, the test server's client.
func (f *fakeS3) config(t *testing.T) Config {
	t.Helper()
	logger := zerolog.New(zerolog.NewTestWriter(t))
	return Config{
		Bucket:           testBucket,
		Endpoint:         f.srv.URL,
		Region:           "auto",
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDTEST", "secret-test", ""),
		HTTPClient:       f.srv.Client(),
		SkipSharedConfig: true,
		Logger:           &logger,
	}
}

// store returns a Store on the fake, closed at cleanup.
func (f *fakeS3) store(t *testing.T, mutate func(*Config)) *Store {
	t.Helper()
	cfg := f.config(t)
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// object returns the raw bytes the fake holds for an object name.
func (f *fakeS3) object(t *testing.T, name string) ([]byte, bool) {
	t.Helper()
	obj, err := f.backend.GetObject(testBucket, name, nil)
	if err != nil {
		return nil, false
	}
	defer obj.Contents.Close()
	b, err := io.ReadAll(obj.Contents)
	require.NoError(t, err)
	return b, true
}
