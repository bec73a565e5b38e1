package dispatcher

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/internal/schedule"

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

// FuzzDecodeSchedule: schedule requests come from any client (a tenant
// among them); the decoder never panics, and what it accepts names a
// valid tenant and schedule, and for "add" a spec that compiles and a job
// of that tenant with no id and no trigger of its own.
func FuzzDecodeSchedule(f *testing.F) {
	for _, s := range []string{
		`{"action":"ls"}`, `{"action":"ls","tenant":"acme"}`, `{"action":"rm","name":"n"}`, `{"action":"pause","name":"../x"}`,
		`{"action":"add","name":"n","spec":{"every":"1m"},"job":{"prompt":"p"}}`,
		`{"action":"add","name":"n","spec":{"cron":"0 0 9 * * 1-5","tz":"Europe/Paris"},"job":{"prompt":"p","trigger":{"kind":"github"}}}`,
		`{"action":"add","name":"n","spec":{"cron":"0 0 9 * * *"},"job":{"prompt":"p","tenant":"other"}}`,
		`{"action":"add","name":"n","spec":{"at":"2099-01-01T00:00:00Z"},"job":{"id":"x","prompt":"p"}}`,
		`{"action":"ls","extra":1}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, e := decodeSchedule(data)
		if e != nil {
			if e.Code != protocol.CodeInvalidJob {
				t.Fatalf("error code %q", e.Code)
			}
			return
		}
		if (req.Tenant != "" || req.Action != protocol.ScheduleList) && !protocol.ValidTenant(req.Tenant) || (req.Name != "" && !protocol.ValidScheduleName(req.Name)) {
			t.Fatalf("accepted %+v", req)
		}
		if req.Action != protocol.ScheduleAdd {
			return
		}
		if req.Job == nil || req.Spec == nil || req.Job.ID != "" || req.Job.Tenant != req.Tenant || req.Job.Trigger != nil {
			t.Fatalf("accepted add %+v", req)
		}
		if _, err := schedule.Compile(*req.Spec, time.Now().Add(-time.Minute)); err != nil {
			t.Fatalf("accepted a spec that does not compile: %v", err)
		}
	})
}
