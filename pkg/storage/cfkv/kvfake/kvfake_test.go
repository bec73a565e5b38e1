package kvfake_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/pkg/storage/cfkv/kvfake"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	acct  = "acct1"
	ns    = "ns1"
	token = "tok"
	base  = "/client/v4/accounts/" + acct + "/storage/kv/namespaces/" + ns
)

type answer struct {
	status int
	header http.Header
	body   []byte
	env    struct {
		Success    bool                 `json:"success"`
		Errors     []struct{ Code int } `json:"errors"`
		Result     json.RawMessage      `json:"result"`
		ResultInfo struct {
			Count  int    `json:"count"`
			Cursor string `json:"cursor"`
		} `json:"result_info"`
	}
}

func (a answer) code() int {
	if len(a.env.Errors) == 0 {
		return 0
	}
	return a.env.Errors[0].Code
}

// do sends one request to f (in process, through the real http machinery
// of httptest) and decodes the envelope when the answer is JSON.
func do(t *testing.T, srv *httptest.Server, method, path, ctype string, body []byte, auth string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, bytes.NewReader(body))
	require.NoError(t, err)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	var a answer
	a.status, a.header = res.StatusCode, res.Header
	a.body, err = io.ReadAll(res.Body)
	require.NoError(t, err)
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(a.body, &a.env), "%s", a.body)
	}
	return a
}

func setup(t *testing.T, mutate func(*kvfake.Server)) (*kvfake.Server, *httptest.Server) {
	t.Helper()
	f := kvfake.New(token, acct, ns)
	if mutate != nil {
		mutate(f)
	}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func TestAuth(t *testing.T) {
	t.Parallel()
	f, srv := setup(t, nil)
	for _, auth := range []string{"", "wrong"} {
		a := do(t, srv, http.MethodGet, base+"/values/k", "", nil, auth)
		require.Equal(t, http.StatusForbidden, a.status)
		require.Equal(t, kvfake.CodeAuth, a.code())
		require.False(t, a.env.Success)
	}
	require.Equal(t, 2, f.Stats().Unauthorized)
}

func TestRawValuesAreStoredAsReceived(t *testing.T) {
	t.Parallel()
	f, srv := setup(t, nil)
	body := []byte("{\"value\":\"x\"}\x00\xff")
	a := do(t, srv, http.MethodPut, base+"/values/a%2Fb", "application/json", body, token)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.True(t, a.env.Success)
	v, ok := f.Value("a/b")
	require.True(t, ok)
	require.Equal(t, body, v)

	a = do(t, srv, http.MethodGet, base+"/values/a%2Fb", "", nil, token)
	require.Equal(t, http.StatusOK, a.status)
	require.Equal(t, body, a.body)
}

func TestMultipartValueAndMetadata(t *testing.T) {
	t.Parallel()
	f, srv := setup(t, nil)
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, err := mw.CreateFormField("value")
	require.NoError(t, err)
	_, _ = fw.Write([]byte("v\r\n--x"))
	require.NoError(t, mw.WriteField("metadata", `{"state":"done"}`))
	require.NoError(t, mw.Close())
	a := do(t, srv, http.MethodPut, base+"/values/k?expiration_ttl=60", mw.FormDataContentType(), buf.Bytes(), token)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	v, _ := f.Value("k")
	require.Equal(t, "v\r\n--x", string(v))
	m, _ := f.Metadata("k")
	require.JSONEq(t, `{"state":"done"}`, string(m))

	a = do(t, srv, http.MethodGet, base+"/metadata/k", "", nil, token)
	require.Equal(t, http.StatusOK, a.status)
	require.JSONEq(t, `{"state":"done"}`, string(a.env.Result))
}

func TestRoutingAndEscaping(t *testing.T) {
	t.Parallel()
	_, srv := setup(t, nil)
	// An unescaped '/' splits the key into segments: no route.
	a := do(t, srv, http.MethodPut, base+"/values/a/b", "", []byte("v"), token)
	require.Equal(t, http.StatusNotFound, a.status)
	require.Equal(t, kvfake.CodeNoRoute, a.code())
	// Without the /client/v4 prefix the routes work too.
	a = do(t, srv, http.MethodPut, strings.TrimPrefix(base, "/client/v4")+"/values/x", "", []byte("v"), token)
	require.Equal(t, http.StatusOK, a.status)
	// Another namespace is not served.
	a = do(t, srv, http.MethodGet, "/client/v4/accounts/"+acct+"/storage/kv/namespaces/other/values/x", "", nil, token)
	require.Equal(t, http.StatusNotFound, a.status)
}

func TestMissingKey(t *testing.T) {
	t.Parallel()
	_, srv := setup(t, nil)
	a := do(t, srv, http.MethodGet, base+"/values/nope", "", nil, token)
	require.Equal(t, http.StatusNotFound, a.status)
	require.Equal(t, kvfake.CodeKeyNotFound, a.code())
	a = do(t, srv, http.MethodDelete, base+"/values/nope", "", nil, token)
	require.Equal(t, http.StatusOK, a.status, "deleting a missing key succeeds")
}

func TestLimits(t *testing.T) {
	t.Parallel()
	_, srv := setup(t, func(f *kvfake.Server) { f.WriteInterval = 0 })
	a := do(t, srv, http.MethodPut, base+"/values/"+strings.Repeat("k", kvfake.MaxKeyBytes+1), "", []byte("v"), token)
	require.Equal(t, http.StatusRequestURITooLong, a.status)
	a = do(t, srv, http.MethodPut, base+"/values/"+strings.Repeat("k", kvfake.MaxKeyBytes), "", []byte("v"), token)
	require.Equal(t, http.StatusOK, a.status)
	a = do(t, srv, http.MethodPut, base+"/values/big", "", make([]byte, kvfake.MaxValueBytes+1), token)
	require.Equal(t, http.StatusRequestEntityTooLarge, a.status)
	a = do(t, srv, http.MethodPut, base+"/values/ttl?expiration_ttl=59", "", []byte("v"), token)
	require.Equal(t, http.StatusBadRequest, a.status)
	a = do(t, srv, http.MethodPut, base+"/values/exp?expiration=1", "", []byte("v"), token)
	require.Equal(t, http.StatusBadRequest, a.status)
	a = do(t, srv, http.MethodGet, base+"/keys?limit=5", "", nil, token)
	require.Equal(t, http.StatusBadRequest, a.status)
	items := fmt.Sprintf(`[{"key":"m","value":"v","metadata":{"pad":%q}}]`, strings.Repeat("x", kvfake.MaxMetadataBytes))
	a = do(t, srv, http.MethodPut, base+"/bulk", "application/json", []byte(items), token)
	require.Equal(t, http.StatusBadRequest, a.status)
}

func TestOneWritePerKeyPerInterval(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	f, srv := setup(t, func(f *kvfake.Server) { f.Now = func() time.Time { return now } })
	a := do(t, srv, http.MethodPut, base+"/values/k", "", []byte("1"), token)
	require.Equal(t, http.StatusOK, a.status)
	a = do(t, srv, http.MethodPut, base+"/values/k", "", []byte("2"), token)
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Equal(t, kvfake.CodeKeyRateLimited, a.code())
	require.NotEmpty(t, a.header.Get("Retry-After"))
	a = do(t, srv, http.MethodPut, base+"/values/other", "", []byte("x"), token)
	require.Equal(t, http.StatusOK, a.status, "other keys are not limited")
	// In a bulk write the limited key is reported unsuccessful.
	a = do(t, srv, http.MethodPut, base+"/bulk", "application/json", []byte(`[{"key":"k","value":"3"},{"key":"n","value":"4"}]`), token)
	require.Equal(t, http.StatusOK, a.status)
	require.JSONEq(t, `{"successful_key_count":1,"unsuccessful_keys":["k"]}`, string(a.env.Result))
	now = now.Add(time.Second)
	a = do(t, srv, http.MethodPut, base+"/values/k", "", []byte("5"), token)
	require.Equal(t, http.StatusOK, a.status, "a second later the key may be written again")
	v, _ := f.Value("k")
	require.Equal(t, "5", string(v))
	require.Equal(t, 2, f.Stats().KeyRateLimited)
}

func TestAccountBudget(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	f, srv := setup(t, func(f *kvfake.Server) {
		f.Now = func() time.Time { return now }
		f.Budget = 2
		f.BudgetWindow = 10 * time.Second
	})
	for range 2 {
		require.Equal(t, http.StatusNotFound, do(t, srv, http.MethodGet, base+"/values/k", "", nil, token).status)
	}
	a := do(t, srv, http.MethodGet, base+"/values/k", "", nil, token)
	require.Equal(t, http.StatusTooManyRequests, a.status)
	require.Equal(t, kvfake.CodeAccountThrottle, a.code())
	require.Equal(t, "10", a.header.Get("Retry-After"))
	now = now.Add(10 * time.Second)
	require.Equal(t, http.StatusNotFound, do(t, srv, http.MethodGet, base+"/values/k", "", nil, token).status)
	require.Equal(t, 1, f.Stats().BudgetLimited)
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	f, srv := setup(t, func(f *kvfake.Server) { f.Now = func() time.Time { return now } })
	require.Equal(t, http.StatusOK, do(t, srv, http.MethodPut, base+"/values/k?expiration_ttl=60", "", []byte("v"), token).status)
	a := do(t, srv, http.MethodGet, base+"/values/k", "", nil, token)
	require.Equal(t, fmt.Sprint(now.Unix()+60), a.header.Get("Expiration"))
	now = now.Add(time.Minute)
	_, ok := f.Value("k")
	require.False(t, ok)
}

func TestListWithPrefixAndCursor(t *testing.T) {
	t.Parallel()
	f, srv := setup(t, nil)
	for i := range 23 {
		f.Set(fmt.Sprintf("p/%02d", i), []byte("v"))
	}
	f.Set("q/x", []byte("v"))
	var names []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		path := base + "/keys?prefix=p%2F&limit=10"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		a := do(t, srv, http.MethodGet, path, "", nil, token)
		require.Equal(t, http.StatusOK, a.status)
		var page []struct{ Name string }
		require.NoError(t, json.Unmarshal(a.env.Result, &page))
		require.Equal(t, len(page), a.env.ResultInfo.Count)
		for _, p := range page {
			names = append(names, p.Name)
		}
		if cursor = a.env.ResultInfo.Cursor; cursor == "" {
			break
		}
	}
	require.Len(t, names, 23)
	for i, n := range names {
		require.Equal(t, fmt.Sprintf("p/%02d", i), n)
	}
}

func TestBulkWriteAndDelete(t *testing.T) {
	t.Parallel()
	f, srv := setup(t, func(f *kvfake.Server) { f.WriteInterval = 0 })
	a := do(t, srv, http.MethodPut, base+"/bulk", "application/json",
		[]byte(`[{"key":"a","value":"AAEC/w==","base64":true},{"key":"b","value":"text","metadata":{"s":1},"expiration_ttl":120}]`), token)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	v, _ := f.Value("a")
	require.Equal(t, []byte{0, 1, 2, 255}, v)
	v, _ = f.Value("b")
	require.Equal(t, "text", string(v))
	a = do(t, srv, http.MethodPut, base+"/bulk", "application/json", []byte(`[{"key":"c","value":"!!","base64":true}]`), token)
	require.Equal(t, http.StatusBadRequest, a.status, "invalid base64")
	a = do(t, srv, http.MethodPost, base+"/bulk/delete", "application/json", []byte(`["a","b","zz"]`), token)
	require.Equal(t, http.StatusOK, a.status)
	require.JSONEq(t, `{"successful_key_count":3,"unsuccessful_keys":[]}`, string(a.env.Result))
	_, ok := f.Value("a")
	require.False(t, ok)
}

// FuzzBulkBody feeds arbitrary bodies to the bulk routes: the fake must
// answer 200 or a 4xx envelope, never panic.
func FuzzBulkBody(f *testing.F) {
	f.Add([]byte(`[{"key":"a","value":"v"}]`), true)
	f.Add([]byte(`[{"key":"a","value":"AAE=","base64":true,"expiration_ttl":60,"metadata":{"x":1}}]`), true)
	f.Add([]byte(`["a","b"]`), false)
	f.Add([]byte(`{"key":"a"}`), true)
	f.Add([]byte(`[{"key":"","value":null,"expiration":1e400}]`), true)
	f.Fuzz(func(t *testing.T, body []byte, put bool) {
		srv := kvfake.New(token, acct, ns)
		method, path := http.MethodPost, base+"/bulk/delete"
		if put {
			method, path = http.MethodPut, base+"/bulk"
		}
		req := httptest.NewRequest(method, path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK && (rec.Code < 400 || rec.Code >= 500) {
			t.Fatalf("status %d for %q", rec.Code, body)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("answer is not JSON: %q", rec.Body.Bytes())
		}
	})
}
