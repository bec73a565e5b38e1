package dispatcher

import (
	"testing"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// FuzzDecodeRef: API requests come from any client; decodeRef never panics
// and accepts only ids and tenants that are safe to put in a subject.
func FuzzDecodeRef(f *testing.F) {
	for _, s := range []string{`{"id":"q1"}`, `{"id":"q1","tenant":"acme"}`, `{"id":"../x"}`, `{"id":"a.b"}`, `[]`, `{`, `{"id":1}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ref, e := decodeRef(data)
		if e != nil {
			if e.Code != protocol.CodeInvalidJob {
				t.Fatalf("error code %q", e.Code)
			}
			return
		}
		if !protocol.ValidID(ref.ID) || !protocol.ValidTenant(ref.Tenant) {
			t.Fatalf("accepted %+v", ref)
		}
	})
}
