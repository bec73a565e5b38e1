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

// FuzzDecodeSessionOp: session op requests come from any client; the
// decoder never panics, and what it accepts is a valid query and .ctl op.
func FuzzDecodeSessionOp(f *testing.F) {
	for _, s := range []string{`{"id":"s1","text":"hi"}`, `{"id":"s1","tenant":"acme","request_id":"r","allow":true}`,
		`{"id":"s1","allow":"yes"}`, `{"id":"s1","text":""}`, `{"id":"s1","uuid":"-x","text":"a"}`, `[]`, ``} {
		for i := range 4 {
			f.Add(uint8(i), []byte(s))
		}
	}
	ops := []string{protocol.OpInput, protocol.OpInterrupt, protocol.OpApprove, protocol.OpEnd}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		op := ops[int(which)%len(ops)]
		ref, ctl, e := decodeSessionOp(op, data)
		if e != nil {
			if e.Code != protocol.CodeInvalidJob {
				t.Fatalf("error code %q", e.Code)
			}
			return
		}
		if !protocol.ValidID(ref.ID) || !protocol.ValidTenant(ref.Tenant) || ctl.Op != op || ctl.Validate() != nil {
			t.Fatalf("accepted %+v %+v", ref, ctl)
		}
	})
}
