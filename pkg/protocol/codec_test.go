package protocol

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

var goldenAt = time.Date(2026, 4, 1, 12, 30, 45, 123456789, time.UTC)

func succeededStatus() *StatusEvent {
	return &StatusEvent{
		V: SchemaVersion, ID: "q-1_a", Tenant: "acme", State: StateSucceeded, Attempt: 2, Worker: "worker-7",
		At: goldenAt,
		Result: &ResultSummary{
			Subtype: SubtypeSuccess, NumTurns: 3, DurationMS: 12034, TotalCostUSD: 0.07480450000000001,
			SessionID: "b401fe91-732e-4a27-94aa-942d088a6ed5", Errors: []string{"note"},
			Usage: json.RawMessage(`{"input_tokens":12,"output_tokens":340}`), Synthetic: false, Lines: 42, LastSeq: 57,
		},
		Metadata: map[string]string{"ticket": "OPS-12", "b": "2"},
	}
}

func failedStatus() *StatusEvent {
	return &StatusEvent{
		V: SchemaVersion, ID: "q2", Tenant: DefaultTenant, State: StateFailed, Attempt: 1, At: goldenAt,
		Error: &ErrorInfo{Code: CodeInvalidJob, Message: "invalid job: options.max_turns: must be an integer, got string"},
	}
}

// codecCases lists one value of every wire type. Each is round-tripped
// through every codec and pinned by golden files testdata/<name>.json and
// testdata/<name>.msgpack.
var codecCases = []struct {
	name  string
	value any // a pointer
}{
	{name: "job_full", value: fullJob()},
	{name: "job_minimal", value: &Job{ID: "q1", Prompt: "hi"}},
	{name: "status_succeeded", value: succeededStatus()},
	{name: "status_failed", value: failedStatus()},
	{name: "status_queued", value: &StatusEvent{V: SchemaVersion, ID: "q3", Tenant: "t", State: StateQueued, At: goldenAt}},
	{name: "ctl_cancel", value: &CtlOp{Op: OpCancel}},
	{name: "ctl_fence", value: &CtlOp{Op: OpFence, Attempt: 3}},
	{name: "submit_reply", value: &SubmitReply{ID: "q1", Tenant: "acme", Subjects: &QuerySubjects{
		Msg: "fleet.query.acme.q1.msg", Status: "fleet.query.acme.q1.status", Ctl: "fleet.query.acme.q1.ctl"}}},
	{name: "submit_reply_error", value: &SubmitReply{Error: &ErrorInfo{Code: CodeInvalidJob, Message: "invalid job: prompt: is required"}}},
	{name: "query_ref", value: &QueryRef{ID: "q1", Tenant: "acme"}},
	{name: "api_reply_status", value: &APIReply{OK: true, Status: succeededStatus()}},
	{name: "api_reply_list", value: &APIReply{OK: true, Queries: []StatusEvent{*failedStatus(), *succeededStatus()}}},
	{name: "api_reply_error", value: &APIReply{Error: &ErrorInfo{Code: CodeNotFound, Message: "no query acme/q9"}}},
	{name: "list_request", value: &ListRequest{Tenant: "acme", State: StateRunning, Limit: 50}},
	{name: "job_workspace", value: workspaceJob()},
	{name: "status_running_workspace", value: &StatusEvent{V: SchemaVersion, ID: "q4", Tenant: "acme", State: StateRunning,
		Attempt: 1, At: goldenAt, Workspace: &WorkspaceStatus{StartSHA: goldenSHA}}},
	{name: "status_succeeded_workspace", value: workspaceSucceededStatus()},
	{name: "artifact", value: goldenArtifact()},
	// Sessions (docs/sessions.md): session.go.
	{name: "job_session", value: &Job{ID: "s1", Prompt: "hi", Session: &Session{IdleTimeoutS: ptr(60), Approvals: ApprovalsRemote}}},
	{name: "ctl_input", value: &CtlOp{Op: OpInput, SessionOp: SessionOp{Text: "and now?", UUID: "u-1"}}},
	{name: "ctl_approve", value: &CtlOp{Op: OpApprove, SessionOp: SessionOp{RequestID: "r1", Allow: ptr(false), Message: "not that file",
		UpdatedInput: map[string]any{"command": "ls"}}}},
	{name: "status_awaiting_approval", value: &StatusEvent{V: SchemaVersion, ID: "s1", Tenant: "acme", State: StateAwaitingApproval, Attempt: 1, At: goldenAt,
		SessionStatus: SessionStatus{Turn: 2, RequestID: "r1", ToolName: "Bash", ClaudeSessionID: "b401fe91-732e-4a27-94aa-942d088a6ed5"}}},
	{name: "status_parked", value: &StatusEvent{V: SchemaVersion, ID: "s1", Tenant: "acme", State: StateParked, Attempt: 1, At: goldenAt,
		SessionStatus: SessionStatus{Turn: 3, ClaudeSessionID: "b401fe91-732e-4a27-94aa-942d088a6ed5", CtlSeq: 42, Session: true}}},
	{name: "session_op_request", value: &SessionOpRequest{ID: "s1", Tenant: "acme", SessionOp: SessionOp{Text: "go on"}}},
}

var codecs = []Codec{JSON{}, Msgpack{}}

func extension(c Codec) string {
	if c.ContentType() == ContentTypeMsgpack {
		return ".msgpack"
	}
	return ".json"
}

// expectedAfter returns what decoding want's encoding with codec gives:
// msgpack drops json.RawMessage usage (tagged msgpack:"-").
func expectedAfter(c Codec, want any) any {
	if _, ok := c.(Msgpack); !ok {
		return want
	}
	b, err := json.Marshal(want)
	if err != nil {
		panic(err)
	}
	clone := reflect.New(reflect.TypeOf(want).Elem()).Interface()
	if err := json.Unmarshal(b, clone); err != nil {
		panic(err)
	}
	dropUsage(clone)
	return clone
}

func dropUsage(v any) {
	switch v := v.(type) {
	case *StatusEvent:
		if v != nil && v.Result != nil {
			v.Result.Usage = nil
		}
	case *APIReply:
		dropUsage(v.Status)
		for i := range v.Queries {
			dropUsage(&v.Queries[i])
		}
	}
}

// utcTimes puts decoded times in UTC (msgpack decodes them in time.Local).
func utcTimes(v any) {
	switch v := v.(type) {
	case *StatusEvent:
		if v != nil {
			v.At = v.At.UTC()
		}
	case *APIReply:
		utcTimes(v.Status)
		for i := range v.Queries {
			utcTimes(&v.Queries[i])
		}
	}
}

func TestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range codecs {
		for _, tc := range codecCases {
			t.Run(c.ContentType()+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				b, err := c.Marshal(tc.value)
				require.NoError(t, err)
				got := reflect.New(reflect.TypeOf(tc.value).Elem()).Interface()
				require.NoError(t, c.Unmarshal(b, got))
				utcTimes(got)
				require.Equal(t, expectedAfter(c, tc.value), got)

				again, err := c.Marshal(got)
				require.NoError(t, err)
				if _, isMsgpack := c.(Msgpack); !isMsgpack || !bytes.Contains(b, []byte("usage")) {
					require.Equal(t, b, again, "re-encoding must be byte-identical")
				}
			})
		}
	}
}

func TestCodecGolden(t *testing.T) {
	t.Parallel()
	for _, c := range codecs {
		for _, tc := range codecCases {
			t.Run(c.ContentType()+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				b, err := c.Marshal(tc.value)
				require.NoError(t, err)
				path := filepath.Join("testdata", tc.name+extension(c))
				if *update {
					require.NoError(t, os.WriteFile(path, b, 0o644))
				}
				golden, err := os.ReadFile(path)
				require.NoError(t, err, "run go test -update to create golden files")
				require.Equal(t, golden, b, "wire encoding of %s changed; if intended, run go test -update", tc.name)

				got := reflect.New(reflect.TypeOf(tc.value).Elem()).Interface()
				require.NoError(t, c.Unmarshal(golden, got))
				utcTimes(got)
				require.Equal(t, expectedAfter(c, tc.value), got)
			})
		}
	}
}

func TestCodecFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		contentType string
		want        Codec
	}{
		{"", JSON{}},
		{"application/json", JSON{}},
		{"application/json; charset=utf-8", JSON{}},
		{" Application/JSON ", JSON{}},
		{"application/msgpack", Msgpack{}},
		{"application/msgpack;v=1", Msgpack{}},
	}
	for _, tt := range tests {
		c, err := CodecFor(tt.contentType)
		require.NoError(t, err, tt.contentType)
		require.Equal(t, tt.want, c, tt.contentType)
	}
	for _, bad := range []string{"text/plain", "application/jsonx", "application/x-protobuf"} {
		_, err := CodecFor(bad)
		require.ErrorIs(t, err, ErrUnsupportedContentType, bad)
	}
	require.Equal(t, ContentTypeJSON, JSON{}.ContentType())
	require.Equal(t, ContentTypeMsgpack, Msgpack{}.ContentType())
}

func TestMsgpackRejectsTrailingBytes(t *testing.T) {
	t.Parallel()
	b, err := Msgpack{}.Marshal(&CtlOp{Op: OpCancel})
	require.NoError(t, err)
	var op CtlOp
	require.Error(t, Msgpack{}.Unmarshal(append(b, 0xc0), &op))
}

func mustMsgpack(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestDecodeJob(t *testing.T) {
	t.Parallel()

	full, err := json.Marshal(fullJob())
	require.NoError(t, err)
	fullMsgpack, err := Msgpack{}.Marshal(fullJob())
	require.NoError(t, err)

	tests := []struct {
		name        string
		contentType string
		body        []byte
		wantField   string // "" = decodes
		wantReason  string // substring of the reason
		wantID      string // best-effort identity on error
		wantTenant  string
	}{
		{name: "json", body: full},
		{name: "json content type", contentType: "application/json", body: full},
		{name: "json with charset", contentType: "application/json; charset=utf-8", body: full},
		{name: "msgpack", contentType: "application/msgpack", body: fullMsgpack},
		{name: "unknown fields ignored", body: []byte(`{"id":"q1","prompt":"p","future":{"x":[1,{"y":null}]},"options":{"new_opt":true}}`)},
		{name: "leading whitespace", body: []byte(" \n\t{\"id\":\"q1\",\"prompt\":\"p\"}")},

		{name: "unsupported content type", contentType: "text/plain", body: []byte(`{"id":"q1","tenant":"acme","prompt":"p"}`),
			wantField: "Content-Type", wantReason: "text/plain", wantID: "q1", wantTenant: "acme"},
		{name: "too large", body: append([]byte(`{"id":"q1","tenant":"acme","prompt":"`), append(bytes.Repeat([]byte("a"), MaxJobBytes), `"}`...)...),
			wantField: "body", wantReason: "at most 1048576", wantID: "q1", wantTenant: "acme"},
		{name: "array body", body: []byte(`[{"id":"q1"}]`), wantField: "body", wantReason: "JSON object"},
		{name: "null body", body: []byte(`null`), wantField: "body", wantReason: "JSON object"},
		{name: "string body", body: []byte(`"q1"`), wantField: "body", wantReason: "JSON object"},
		{name: "empty body", body: nil, wantField: "body", wantReason: "JSON object"},
		{name: "truncated", body: []byte(`{"id":"q1","prompt":`), wantField: "body", wantReason: "invalid JSON"},
		{name: "trailing garbage", body: []byte(`{"id":"q1","prompt":"p"} x`), wantField: "body", wantReason: "invalid JSON"},

		{name: "max_turns string", body: []byte(`{"id":"q1","tenant":"acme","prompt":"p","options":{"max_turns":"x"}}`),
			wantField: "options.max_turns", wantReason: "must be an integer", wantID: "q1", wantTenant: "acme"},
		{name: "max_turns fraction", body: []byte(`{"id":"q1","prompt":"p","options":{"max_turns":1.5}}`),
			wantField: "options.max_turns", wantReason: "must be an integer, got number 1.5", wantID: "q1"},
		{name: "budget string", body: []byte(`{"id":"q1","prompt":"p","options":{"max_budget_usd":"1"}}`),
			wantField: "options.max_budget_usd", wantReason: "must be a number", wantID: "q1"},
		{name: "tools not array", body: []byte(`{"id":"q1","prompt":"p","options":{"allowed_tools":"Read"}}`),
			wantField: "options.allowed_tools", wantReason: "must be an array of strings", wantID: "q1"},
		{name: "tool not string", body: []byte(`{"id":"q1","prompt":"p","options":{"allowed_tools":["Read",1]}}`),
			wantField: "options.allowed_tools", wantReason: "must be an array of strings", wantID: "q1"},
		{name: "metadata value not string", body: []byte(`{"id":"q1","prompt":"p","metadata":{"a":1}}`),
			wantField: "metadata", wantReason: "must be an object with string values", wantID: "q1"},
		{name: "env not object", body: []byte(`{"id":"q1","prompt":"p","options":{"env":["A=1"]}}`),
			wantField: "options.env", wantReason: "must be an object with string values", wantID: "q1"},
		{name: "options not object", body: []byte(`{"id":"q1","prompt":"p","options":[]}`),
			wantField: "options", wantReason: "must be an object", wantID: "q1"},
		{name: "prompt not string", body: []byte(`{"id":"q1","prompt":5}`),
			wantField: "prompt", wantReason: "must be a string", wantID: "q1"},
		{name: "id not string", body: []byte(`{"id":5,"tenant":"acme","prompt":"p"}`),
			wantField: "id", wantReason: "must be a string", wantTenant: "acme"},
		{name: "unsafe id not probed", body: []byte(`{"id":"a.>","tenant":"acme","prompt":5}`),
			wantField: "prompt", wantTenant: "acme"},

		{name: "invalid UTF-8 prompt", body: []byte("{\"id\":\"q1\",\"prompt\":\"a\xffb\"}"),
			wantField: "prompt", wantReason: "UTF-8", wantID: "q1"},
		{name: "invalid UTF-8 tool", body: []byte("{\"id\":\"q1\",\"prompt\":\"p\",\"options\":{\"allowed_tools\":[\"Read\",\"B\xc3\"]}}"),
			wantField: "options.allowed_tools[1]", wantReason: "UTF-8", wantID: "q1"},
		{name: "invalid UTF-8 metadata value", body: []byte("{\"id\":\"q1\",\"prompt\":\"p\",\"metadata\":{\"k\":\"\xed\xa0\x80\"}}"),
			wantField: "metadata.k", wantReason: "UTF-8", wantID: "q1"},
		{name: "invalid UTF-8 unknown field", body: []byte("{\"id\":\"q1\",\"prompt\":\"p\",\"x\":{\"y\":[\"\xff\"]}}"),
			wantField: "x.y[0]", wantReason: "UTF-8", wantID: "q1"},

		{name: "msgpack not a map", contentType: "application/msgpack", body: mustMsgpack(t, []string{"q1"}),
			wantField: "body", wantReason: "msgpack map"},
		{name: "msgpack empty", contentType: "application/msgpack", body: nil, wantField: "body", wantReason: "msgpack map"},
		{name: "msgpack json body", contentType: "application/msgpack", body: full, wantField: "body", wantReason: "msgpack map"},
		{name: "msgpack wrong type", contentType: "application/msgpack",
			body:      mustMsgpack(t, map[string]any{"id": "q1", "tenant": "acme", "prompt": "p", "options": map[string]any{"max_turns": "x"}}),
			wantField: "options.max_turns", wantReason: "must be an integer", wantID: "q1", wantTenant: "acme"},
		{name: "msgpack trailing bytes", contentType: "application/msgpack", body: append(mustMsgpack(t, map[string]any{"id": "q1", "prompt": "p"}), 0xc0),
			wantField: "body", wantReason: "trailing", wantID: "q1"},
		{name: "msgpack truncated", contentType: "application/msgpack", body: fullMsgpack[:len(fullMsgpack)-3],
			wantField: "body", wantReason: "invalid msgpack", wantID: "q-1_a", wantTenant: "acme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			job, err := DecodeJob(tt.contentType, tt.body)
			require.NotNil(t, job)
			if tt.wantField == "" {
				require.NoError(t, err)
				require.NoError(t, job.Validate("", true))
				return
			}
			require.ErrorIs(t, err, ErrInvalidJob)
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tt.wantField, ve.Field, "error: %v", err)
			require.Contains(t, ve.Reason, tt.wantReason)
			require.Equal(t, tt.wantID, job.ID, "best-effort id")
			require.Equal(t, tt.wantTenant, job.Tenant, "best-effort tenant")
		})
	}
}

func TestDecodeJobMatchesBothCodecs(t *testing.T) {
	t.Parallel()
	for _, c := range codecs {
		b, err := c.Marshal(fullJob())
		require.NoError(t, err)
		job, err := DecodeJob(c.ContentType(), b)
		require.NoError(t, err)
		require.Equal(t, fullJob(), job)
	}
}

func TestDecodeJobMsgpackInvalidUTF8CaughtByValidate(t *testing.T) {
	t.Parallel()
	body := mustMsgpack(t, map[string]any{"id": "q1", "prompt": "a\xffb"})
	job, err := DecodeJob(ContentTypeMsgpack, body)
	require.NoError(t, err)
	var ve *ValidationError
	require.ErrorAs(t, job.Validate("", true), &ve)
	require.Equal(t, "prompt", ve.Field)
}

func TestProbeIdentity(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, contentType string
		body              []byte
		id, tenant        string
	}{
		{name: "json", body: []byte(`{"prompt":5,"tenant":"acme","id":"q1","options":{"max_turns":"x"}}`), id: "q1", tenant: "acme"},
		{name: "json syntax error", body: []byte(`{"id":"q1",`)},
		{name: "json unsafe values", body: []byte(`{"id":"q1.*","tenant":"Acme"}`)},
		{name: "json id wrong type", body: []byte(`{"id":1,"tenant":"acme"}`), tenant: "acme"},
		{name: "msgpack", contentType: ContentTypeMsgpack, body: mustMsgpack(t, map[string]any{"tenant": "acme", "id": "q1", "prompt": 1}), id: "q1", tenant: "acme"},
		{name: "unknown type json body", contentType: "text/plain", body: []byte(`{"id":"q1"}`), id: "q1"},
		{name: "unknown type msgpack body", contentType: "text/plain", body: mustMsgpack(t, map[string]any{"id": "q1"}), id: "q1"},
		{name: "garbage", contentType: ContentTypeMsgpack, body: []byte{0xdf, 0xff}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id, tenant := ProbeIdentity(tt.contentType, tt.body)
			require.Equal(t, tt.id, id)
			require.Equal(t, tt.tenant, tenant)
		})
	}
}

func TestJSONPathAt(t *testing.T) {
	t.Parallel()
	data := []byte(`{"a":{"b":[1,"xx",{"c":"yy"}]},"k":"zz"}`)
	require.Equal(t, "a.b[1]", jsonPathAt(data, bytes.Index(data, []byte("xx"))))
	require.Equal(t, "a.b[2].c", jsonPathAt(data, bytes.Index(data, []byte("yy"))))
	require.Equal(t, "k", jsonPathAt(data, bytes.Index(data, []byte("zz"))))
	require.Equal(t, "a.b[2].c", jsonPathAt(data, bytes.Index(data, []byte(`c"`))))
	require.Empty(t, jsonPathAt(data, len(data)+5))
}

func FuzzDecodeJob(f *testing.F) {
	seeds := [][]byte{
		[]byte(`{"id":"q1","prompt":"hi"}`),
		[]byte(`{"id":"q1","prompt":"hi","options":{"max_turns":"x"}}`),
		[]byte(`{"id":"q1","prompt":"hi","metadata":{"a":"b"},"options":{"env":{"A":"1"},"allowed_tools":["Read"],"max_budget_usd":1e-3}}`),
		[]byte(`[]`), []byte(`null`), []byte("{\"prompt\":\"\xff\"}"), []byte(`{"PROMPT":"a","prompt":"b","id":"x"}`),
	}
	for _, tc := range codecCases {
		if job, ok := tc.value.(*Job); ok {
			b, err := json.Marshal(job)
			if err != nil {
				f.Fatal(err)
			}
			seeds = append(seeds, b)
		}
	}
	for _, s := range seeds {
		f.Add(false, s)
	}
	for _, tc := range codecCases {
		if job, ok := tc.value.(*Job); ok {
			b, err := Msgpack{}.Marshal(job)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(true, b)
		}
	}
	f.Add(true, []byte{0x81, 0xa2, 'i', 'd', 0xa2, 'q', '1'})
	f.Add(true, []byte{0xdf, 0xff, 0xff, 0xff, 0xff})

	f.Fuzz(func(t *testing.T, useMsgpack bool, data []byte) {
		var c Codec = JSON{}
		if useMsgpack {
			c = Msgpack{}
		}
		job, err := DecodeJob(c.ContentType(), data)
		require.NotNil(t, job)
		if err != nil {
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.True(t, job.ID == "" || ValidID(job.ID))
			require.True(t, job.Tenant == "" || ValidTenant(job.Tenant))
			return
		}
		if job.Validate("", false) != nil {
			return
		}
		// A valid job re-encodes to a fixed point, through either codec.
		first, err := c.Marshal(job)
		require.NoError(t, err)
		again, err := DecodeJob(c.ContentType(), first)
		require.NoError(t, err)
		require.NoError(t, again.Validate("", false))
		second, err := c.Marshal(again)
		require.NoError(t, err)
		require.Equal(t, first, second)

		for _, other := range codecs {
			b, err := other.Marshal(again)
			require.NoError(t, err)
			crossed, err := DecodeJob(other.ContentType(), b)
			require.NoError(t, err)
			back, err := c.Marshal(crossed)
			require.NoError(t, err)
			require.Equal(t, first, back, "via %s", other.ContentType())
		}
		require.False(t, strings.ContainsRune(job.Tenant, '.'))
	})
}

func TestMsgpackRejectsHostileLengths(t *testing.T) {
	t.Parallel()
	deep := bytes.Repeat([]byte{0x91}, maxMsgpackDepth+1) // nested one-element arrays
	deep = append(deep, 0xc0)
	tests := []struct {
		name string
		body []byte
	}{
		{name: "map32 of 4G entries", body: []byte{0xdf, 0xff, 0xff, 0xff, 0xff}},
		{name: "array32 of 4G entries", body: []byte{0x81, 0xa1, 'a', 0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0}},
		{name: "str32 of 4G bytes", body: []byte{0x81, 0xa1, 'a', 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'}},
		{name: "bin32 of 4G bytes", body: []byte{0x81, 0xa1, 'a', 0xc6, 0xff, 0xff, 0xff, 0xff}},
		{name: "ext32 of 4G bytes", body: []byte{0x81, 0xa1, 'a', 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{name: "too deep", body: append([]byte{0x81, 0xa1, 'a'}, deep...)},
		{name: "never-used code", body: []byte{0x81, 0xa1, 'a', 0xc1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var v any
			require.Error(t, Msgpack{}.Unmarshal(tt.body, &v))
			_, err := DecodeJob(ContentTypeMsgpack, tt.body)
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, "body", ve.Field)
			require.Contains(t, ve.Reason, "invalid msgpack")
		})
	}
}

func TestCheckMsgpackAcceptsEveryType(t *testing.T) {
	t.Parallel()
	v := map[string]any{
		"nil": nil, "t": true, "f": false, "u8": uint8(200), "u16": uint16(60000), "u32": uint32(1 << 30),
		"u64": uint64(1 << 60), "i8": int8(-100), "i16": int16(-30000), "i32": int32(-1 << 30), "i64": int64(-1 << 60),
		"f32": float32(1.5), "f64": 2.5, "fix": 7, "neg": -3, "str8": strings.Repeat("s", 40),
		"str16": strings.Repeat("s", 300), "str32": strings.Repeat("s", 70000), "bin": []byte("bin"),
		"arr16": make([]int, 20), "map16": map[string]int{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": 8,
			"i": 9, "j": 10, "k": 11, "l": 12, "m": 13, "n": 14, "o": 15, "p": 16, "q": 17},
		"time": goldenAt, "nested": []any{map[string]any{"x": []any{1, "y"}}},
	}
	b, err := Msgpack{}.Marshal(v)
	require.NoError(t, err)
	require.NoError(t, checkMsgpack(b))
	for cut := range len(b) {
		require.Error(t, checkMsgpack(b[:cut]), "truncated at %d", cut)
	}
}

// FuzzCodecUnmarshal decodes arbitrary bytes into every wire type with both
// codecs: it must never panic, and whatever decodes must encode again.
func FuzzCodecUnmarshal(f *testing.F) {
	for _, c := range codecs {
		for _, tc := range codecCases {
			b, err := c.Marshal(tc.value)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(c.ContentType() == ContentTypeMsgpack, b)
		}
	}
	f.Add(true, []byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, useMsgpack bool, data []byte) {
		var c Codec = JSON{}
		if useMsgpack {
			c = Msgpack{}
		}
		for _, tc := range codecCases {
			v := reflect.New(reflect.TypeOf(tc.value).Elem()).Interface()
			if c.Unmarshal(data, v) != nil {
				continue
			}
			_, err := c.Marshal(v)
			if err != nil {
				// Only a NaN or infinite float cannot be encoded as JSON.
				require.Contains(t, err.Error(), "unsupported value")
			}
		}
	})
}
