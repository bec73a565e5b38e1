package protocol

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSessionValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		session *Session
		field   string // "" = valid
	}{
		{"absent", nil, ""},
		{"empty", &Session{}, ""},
		{"remote", &Session{Approvals: ApprovalsRemote, IdleTimeoutS: ptr(1)}, ""},
		{"none", &Session{Approvals: ApprovalsNone, IdleTimeoutS: ptr(MaxTimeoutS)}, ""},
		{"zero idle", &Session{IdleTimeoutS: ptr(0)}, "session.idle_timeout_s"},
		{"huge idle", &Session{IdleTimeoutS: ptr(MaxTimeoutS + 1)}, "session.idle_timeout_s"},
		{"bad approvals", &Session{Approvals: "maybe"}, "session.approvals"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := &Job{ID: "q", Prompt: "p", Session: tc.session}
			err := j.Validate("", true)
			if tc.field == "" {
				require.NoError(t, err)
				return
			}
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tc.field, ve.Field)
		})
	}
	require.Equal(t, DefaultIdleTimeoutS, (*Session)(nil).IdleTimeout())
	require.Equal(t, 7, (&Session{IdleTimeoutS: ptr(7)}).IdleTimeout())
	require.False(t, (*Session)(nil).RemoteApprovals())
}

func TestDecodeCtlOp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body  string
		field string // "" = valid
	}{
		{`{"op":"cancel"}`, ""},
		{`{"op":"interrupt"}`, ""},
		{`{"op":"end"}`, ""},
		{`{"op":"input","text":"hello"}`, ""},
		{`{"op":"input","text":"hello","uuid":"a-1"}`, ""},
		{`{"op":"approve","request_id":"r","allow":true}`, ""},
		{`{"op":"approve","request_id":"r","allow":false,"message":"no","updated_input":{"a":1}}`, ""},
		{`{"op":"input"}`, "text"},
		{`{"op":"input","text":""}`, "text"},
		{`{"op":"input","text":"x","uuid":"-bad"}`, "uuid"},
		{`{"op":"approve","allow":true}`, "request_id"},
		{`{"op":"approve","request_id":"r"}`, "allow"},
		{`{"op":"dance"}`, "op"},
		{`{}`, "op"},
		{`[]`, "body"},
		{`{"op":1}`, "body"},
		{"{\"op\":\"input\",\"text\":\"\xff\"}", "body"},
		{`{"op":"input","text":"a` + strings.Repeat("x", MaxCtlBytes) + `"}`, "body"},
	} {
		op, err := DecodeCtlOp(ContentTypeJSON, []byte(tc.body))
		if tc.field == "" {
			require.NoError(t, err, tc.body)
			continue
		}
		var ve *ValidationError
		require.ErrorAs(t, err, &ve, tc.body)
		require.Equal(t, tc.field, ve.Field, tc.body)
		_ = op
	}
	op, err := DecodeCtlOp(ContentTypeJSON, []byte(`{"op":"approve","request_id":"r","allow":false}`))
	require.NoError(t, err)
	require.NotNil(t, op.Allow)
	require.False(t, *op.Allow)
	b, err := Msgpack{}.Marshal(&CtlOp{Op: OpInput, SessionOp: SessionOp{Text: "hi"}})
	require.NoError(t, err)
	op, err = DecodeCtlOp(ContentTypeMsgpack, b)
	require.NoError(t, err)
	require.Equal(t, "hi", op.Text)
	_, err = DecodeCtlOp("text/plain", []byte(`{"op":"end"}`))
	require.Error(t, err)
}

func FuzzDecodeCtlOp(f *testing.F) {
	for _, s := range []string{
		`{"op":"input","text":"hello","uuid":"u"}`, `{"op":"approve","request_id":"r","allow":true,"updated_input":{"x":[1,2]}}`,
		`{"op":"interrupt"}`, `{"op":"end"}`, `{"op":"cancel"}`, `{"op":"fence","attempt":2}`, `null`, `{"allow":null}`,
	} {
		f.Add(false, []byte(s))
	}
	for _, tc := range codecCases {
		if op, ok := tc.value.(*CtlOp); ok {
			b, err := Msgpack{}.Marshal(op)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(true, b)
		}
	}
	f.Fuzz(func(t *testing.T, useMsgpack bool, data []byte) {
		var c Codec = JSON{}
		if useMsgpack {
			c = Msgpack{}
		}
		op, err := DecodeCtlOp(c.ContentType(), data)
		if err != nil {
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			return
		}
		// A valid op re-encodes and decodes to a valid op with the same fields.
		b, err := json.Marshal(op)
		require.NoError(t, err)
		again, err := DecodeCtlOp(ContentTypeJSON, b)
		require.NoError(t, err)
		require.Equal(t, op.Op, again.Op)
		require.Equal(t, op.Text, again.Text)
		require.Equal(t, op.RequestID, again.RequestID)
	})
}
