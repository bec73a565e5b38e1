package httpapi

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// FuzzDecodeJob: any body either is refused as a bad request (or a
// tenant's forbidden one) or becomes a valid job of the principal's tenant
// that decodes again to the same job.
func FuzzDecodeJob(f *testing.F) {
	for _, s := range []string{`{"prompt":"hi"}`, `{"id":"q1","tenant":"a","prompt":"x","options":{"max_turns":2}}`,
		`{"prompt":"x","extra":{"kept":true}}`, `[]`, `null`, `{"prompt":""}`, `{"tenant":"b","prompt":"x"}`, "{\"prompt\":\"\xff\"}"} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, b []byte, operator bool) {
		p := Principal{Operator: operator, Tenant: "a"}
		if operator {
			p.Tenant = ""
		}
		out, job, err := decodeJob(b, p)
		if err != nil {
			if !errors.Is(err, errBadRequest) && !errors.Is(err, errForbidden) {
				t.Fatalf("error %v is neither a bad request nor forbidden", err)
			}
			return
		}
		if !operator && job.Tenant != "a" {
			t.Fatalf("a tenant's job went to %q", job.Tenant)
		}
		again, err := protocol.DecodeJob(protocol.ContentTypeJSON, out)
		if err != nil {
			t.Fatalf("the body to submit does not decode: %v", err)
		}
		if again.Tenant != job.Tenant || again.Prompt != job.Prompt || again.ID != job.ID {
			t.Fatalf("the body to submit changed the job: %+v vs %+v", again, job)
		}
	})
}

// FuzzDecodeBodies: the fixed bodies refuse unknown fields and missing
// ones, and what they accept re-encodes to what they decoded.
func FuzzDecodeBodies(f *testing.F) {
	for _, s := range []string{`{"text":"hi"}`, `{"text":""}`, `{"text":"x","y":1}`, `{"allow":true}`,
		`{"allow":false,"message":"no"}`, `{"message":"x"}`, `{} {}`, `{"allow":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if in, err := decodeInput(b); err == nil {
			if in.Text == "" {
				t.Fatal("an empty input was accepted")
			}
			var m map[string]json.RawMessage
			if json.Unmarshal(b, &m) != nil || len(m) != 1 {
				t.Fatalf("accepted %q with fields other than text", b)
			}
		} else if !errors.Is(err, errBadRequest) {
			t.Fatalf("input error %v is not a bad request", err)
		}
		if a, err := decodeApproval(b); err == nil {
			if a.Allow == nil {
				t.Fatal("an approval without allow was accepted")
			}
		} else if !errors.Is(err, errBadRequest) {
			t.Fatalf("approval error %v is not a bad request", err)
		}
	})
}

// FuzzCursorAndLastEventID: a cursor is either refused or a status key
// under the listing's prefix, and encoding it again gives it back.
func FuzzCursorAndLastEventID(f *testing.F) {
	f.Add(encodeCursor("status/a/q1.json"), "a", "12")
	f.Add("zzz", "", "x")
	f.Add(encodeCursor("queries/a/q1/transcript.ndjson"), "", "-1")
	f.Fuzz(func(t *testing.T, c, tenant, last string) {
		if !protocol.ValidTenant(tenant) {
			tenant = ""
		}
		prefix := storage.StatusPrefix(tenant)
		key, err := decodeCursor(c, prefix)
		if err == nil && c != "" && (len(key) < len(prefix) || key[:len(prefix)] != prefix) {
			t.Fatalf("cursor %q gave key %q outside %q", c, key, prefix)
		}
		if err != nil && !errors.Is(err, errBadRequest) {
			t.Fatal(err)
		}
		if _, err := parseLastEventID(last); err != nil && !errors.Is(err, errBadRequest) {
			t.Fatal(err)
		}
	})
}
