package s3

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func randBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

func TestExercise(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	storagetest.Exercise(t, func(t *testing.T) storage.Store {
		return f.store(t, nil)
	}, storagetest.Features{})
}

func TestExerciseWithPrefixAndSmallParts(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	storagetest.Exercise(t, func(t *testing.T) storage.Store {
		return f.store(t, func(c *Config) {
			c.Prefix = "fleet/one"
			c.PartSize = MinPartSize
			c.ListPageSize = 3 // every List spans several pages
		})
	}, storagetest.Features{})
	// Everything the suite wrote lives under the prefix. The suite's
	// subtests are parallel, so they finish after this function returns:
	// check at cleanup.
	t.Cleanup(func() {
		list, err := f.backend.ListBucket(testBucket, nil, gofakes3.ListBucketPage{})
		require.NoError(t, err)
		require.NotEmpty(t, list.Contents)
		for _, o := range list.Contents {
			require.True(t, strings.HasPrefix(o.Key, "fleet/one/"), "object %q outside the prefix", o.Key)
		}
	})
}

func TestMultipartStreamIsByteIdentical(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	s := f.store(t, func(c *Config) { c.PartSize = MinPartSize })
	want := randBytes(t, 10<<20+12345)
	key := storage.TranscriptKey("t1", "q-multipart")

	require.NoError(t, s.PutStream(t.Context(), key, io.MultiReader(bytes.NewReader(want[:3]), bytes.NewReader(want[3:]))))

	got, err := s.Get(t.Context(), key)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "Get returned different bytes")
	raw, ok := f.object(t, key)
	require.True(t, ok)
	require.True(t, bytes.Equal(want, raw), "the fake stored different bytes")

	require.Len(t, f.byOp("CreateMultipartUpload"), 1)
	require.Len(t, f.byOp("CompleteMultipartUpload"), 1)
	require.Empty(t, f.byOp("AbortMultipartUpload"))
	parts := f.byOp("UploadPart")
	require.Len(t, parts, 3)
	// R2 wants every part but the last to have the same size.
	require.Equal(t, int64(MinPartSize), parts[0].ContentLength)
	require.Equal(t, int64(MinPartSize), parts[1].ContentLength)
	require.Equal(t, int64(len(want)-2*MinPartSize), parts[2].ContentLength)
}

func TestPutLargerThanAPartUsesMultipart(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	s := f.store(t, func(c *Config) { c.PartSize = MinPartSize })
	want := randBytes(t, MinPartSize+1)
	require.NoError(t, s.Put(t.Context(), "big/value", want))
	got, err := s.Get(t.Context(), "big/value")
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got))
	require.Len(t, f.byOp("UploadPart"), 2)
	require.Empty(t, f.byOp("PutObject"))
}

func TestSmallStreamIsOnePutObject(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	s := f.store(t, func(c *Config) { c.PartSize = MinPartSize })
	require.NoError(t, s.PutStream(t.Context(), "small", strings.NewReader("tiny")))
	require.Equal(t, []string{"PutObject"}, f.ops())
}

func TestMultipartAbortsWhenTheReaderFails(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	s := f.store(t, func(c *Config) { c.PartSize = MinPartSize })
	boom := errors.New("journal read failed")
	r := io.MultiReader(bytes.NewReader(randBytes(t, 7<<20)), &failingReader{err: boom})

	err := s.PutStream(t.Context(), "broken", r)
	require.ErrorIs(t, err, boom)

	require.Len(t, f.byOp("AbortMultipartUpload"), 1)
	require.Empty(t, f.byOp("CompleteMultipartUpload"))
	require.Len(t, f.byOp("UploadPart"), 1, "the part cut short by the error must not be uploaded")
	_, err = s.Get(t.Context(), "broken")
	require.ErrorIs(t, err, storage.ErrNotFound)
	requireNoOpenUploads(t, f)
}

func TestMultipartAbortsWhenAPartFails(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	s := f.store(t, func(c *Config) {
		c.PartSize = MinPartSize
		c.MaxAttempts = 1
	})
	require.NoError(t, s.Put(t.Context(), "kept", []byte("previous")))
	f.setFailIf(func(r *http.Request) bool {
		return r.Method == http.MethodPut && r.URL.Query().Get("partNumber") == "2"
	})

	err := s.PutStream(t.Context(), "kept", bytes.NewReader(randBytes(t, 11<<20)))
	require.ErrorIs(t, err, storage.ErrUnavailable)

	require.Len(t, f.byOp("AbortMultipartUpload"), 1)
	f.setFailIf(nil)
	got, err := s.Get(t.Context(), "kept")
	require.NoError(t, err)
	require.Equal(t, "previous", string(got), "a failed stream must leave the previous value")
	requireNoOpenUploads(t, f)
}

func TestCreateSendsIfNoneMatchAndMapsPreconditionFailed(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	s := f.store(t, nil)
	key := storage.StatusKey("t1", "q1")

	require.NoError(t, s.Create(t.Context(), key, []byte("one")))
	err := s.Create(t.Context(), key, []byte("two"))
	require.ErrorIs(t, err, storage.ErrExists)

	puts := f.byOp("PutObject")
	require.Len(t, puts, 2)
	for _, p := range puts {
		require.Equal(t, "*", p.IfNoneMatch)
	}
	got, err := s.Get(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, "one", string(got))
}

func TestServerErrorsWrapUnavailable(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	s := f.store(t, func(c *Config) { c.MaxAttempts = 1 })
	f.setFailIf(func(*http.Request) bool { return true })
	_, err := s.Get(t.Context(), "k")
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.ErrorIs(t, s.Put(t.Context(), "k", []byte("v")), storage.ErrUnavailable)
	_, err = s.List(t.Context(), "")
	require.ErrorIs(t, err, storage.ErrUnavailable)
}

func TestListPaginates(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	s := f.store(t, func(c *Config) { c.ListPageSize = 2 })
	var want []string
	for _, k := range []string{"p/e", "p/a", "p/d", "p/b", "p/c", "q/x"} {
		require.NoError(t, s.Put(t.Context(), k, []byte(k)))
		if strings.HasPrefix(k, "p/") {
			want = append(want, k)
		}
	}
	got, err := s.List(t.Context(), "p/")
	require.NoError(t, err)
	require.Equal(t, []string{"p/a", "p/b", "p/c", "p/d", "p/e"}, got)
	require.Len(t, f.byOp("ListObjectsV2"), 3, "5 keys at 2 per page")
	require.Len(t, want, 5)
}

func TestListSkipsObjectsThatAreNotKeys(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	s := f.store(t, nil)
	require.NoError(t, s.Put(t.Context(), "ok/key", []byte("v")))
	_, err := f.backend.PutObject(testBucket, "ok/not a key", map[string]string{}, strings.NewReader("x"), 1, nil)
	require.NoError(t, err)
	got, err := s.List(t.Context(), "ok/")
	require.NoError(t, err)
	require.Equal(t, []string{"ok/key"}, got)
}

func TestClosedStoreFails(t *testing.T) {
	t.Parallel()
	f := newFakeS3(t, nil)
	s := f.store(t, nil)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.Put(t.Context(), "k", nil), ErrClosed)
	_, err := s.Get(t.Context(), "k")
	require.ErrorIs(t, err, ErrClosed)
	_, err = s.List(t.Context(), "")
	require.ErrorIs(t, err, ErrClosed)
	require.Empty(t, f.ops(), "a closed store sends nothing")
}

// TestGuardCatchesSDKChecksumDefaults proves the guard is not vacuous: a
// client with aws-sdk-go-v2's default checksum settings sends headers R2
// rejects, and the guard reports them.
func TestGuardCatchesSDKChecksumDefaults(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var violations []string
	f := newFakeS3(t, func(v string) {
		mu.Lock()
		defer mu.Unlock()
		violations = append(violations, v)
	})
	awsCfg, err := config.LoadDefaultConfig(t.Context(),
		config.WithRegion("auto"),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDTEST", "secret-test", "")),
		config.WithSharedConfigFiles([]string{}),
		config.WithSharedCredentialsFiles([]string{}),
		config.WithRetryMaxAttempts(1),
	)
	require.NoError(t, err)
	client := awss3.NewFromConfig(awsCfg, func(o *awss3.Options) {
		o.UsePathStyle = true
		o.BaseEndpoint = aws.String(f.srv.URL)
		o.HTTPClient = f.srv.Client()
		// Checksum settings left at the SDK defaults (WhenSupported).
	})
	_, err = client.PutObject(t.Context(), &awss3.PutObjectInput{
		Bucket: aws.String(testBucket),
		Key:    aws.String("defaults"),
		Body:   bytes.NewReader([]byte("abcdef")),
	})
	require.Error(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, violations)
	require.Contains(t, strings.ToLower(strings.Join(violations, "\n")), "checksum")
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want Config
		err  string
	}{
		{in: "s3://bucket", want: Config{Bucket: "bucket"}},
		{in: "s3://bucket/", want: Config{Bucket: "bucket"}},
		{
			in:   "s3://fleet/prod/eu/?endpoint=https%3A%2F%2Facct.r2.cloudflarestorage.com&region=auto",
			want: Config{Bucket: "fleet", Prefix: "prod/eu", Endpoint: "https://acct.r2.cloudflarestorage.com", Region: "auto"},
		},
		{in: "s3://b?region=eu-west-1", want: Config{Bucket: "b", Region: "eu-west-1"}},
		{in: "s3:///prefix", err: "no bucket"},
		{in: "s3://b?endpiont=x", err: "unknown URL parameter"},
		{in: "s3://key:secret@b", err: "credentials do not belong"},
		{in: "file:///tmp", err: "s3 scheme"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			t.Parallel()
			u, err := url.Parse(c.in)
			require.NoError(t, err)
			got, err := ParseURL(u)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

func TestOpenBuildsAStoreFromTheURL(t *testing.T) {
	t.Parallel()
	u, err := url.Parse("s3://fleet/pre?endpoint=http://127.0.0.1:1&region=auto")
	require.NoError(t, err)
	st, err := Open(t.Context(), u)
	require.NoError(t, err)
	s := st.(*Store)
	require.Equal(t, "fleet", s.bucket)
	require.Equal(t, "pre/", s.prefix)
	require.NoError(t, st.Close())
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		cfg Config
		err string
	}{
		"no bucket":        {cfg: Config{}, err: "Bucket is required"},
		"small parts":      {cfg: Config{Bucket: "b", PartSize: MinPartSize - 1}, err: "PartSize"},
		"bad prefix":       {cfg: Config{Bucket: "b", Prefix: "a//b"}, err: "Prefix"},
		"bad endpoint":     {cfg: Config{Bucket: "b", Endpoint: "r2.example"}, err: "Endpoint"},
		"bad page size":    {cfg: Config{Bucket: "b", ListPageSize: 1001}, err: "ListPageSize"},
		"negative retries": {cfg: Config{Bucket: "b", MaxAttempts: -1}, err: "MaxAttempts"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := New(context.Background(), c.cfg)
			require.ErrorContains(t, err, c.err)
		})
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"s3://bucket", "s3://b/p/q?endpoint=https://x&region=auto", "s3:///", "s3://b?x=1",
		"s3://u:p@b/", "s3://b/%2F%2F", "s3://b/a//b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		cfg, err := ParseURL(u)
		if err != nil {
			return
		}
		if cfg.Bucket == "" {
			t.Fatalf("ParseURL(%q) accepted an empty bucket", s)
		}
		if strings.HasPrefix(cfg.Prefix, "/") || strings.HasSuffix(cfg.Prefix, "/") {
			t.Fatalf("ParseURL(%q) left slashes around the prefix %q", s, cfg.Prefix)
		}
	})
}

// failingReader fails every read with err.
type failingReader struct{ err error }

func (r *failingReader) Read([]byte) (int, error) { return 0, r.err }

// requireNoOpenUploads asserts that no multipart upload is left open.
func requireNoOpenUploads(t *testing.T, f *fakeS3) {
	t.Helper()
	cfg := f.config(t)
	s, err := New(context.Background(), cfg)
	require.NoError(t, err)
	out, err := s.client.ListMultipartUploads(t.Context(), &awss3.ListMultipartUploadsInput{Bucket: aws.String(testBucket)})
	require.NoError(t, err)
	require.Empty(t, out.Uploads)
}
