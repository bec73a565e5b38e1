package webhook_test

import (
	"slices"
	"testing"

	"github.com/agentfleet/agentfleet/internal/webhook"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// FuzzDecodeRequest: a webhook API request is refused, or names a valid
// tenant, known events only, a valid endpoint id, and a URL for add.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{`{"tenant":"a","url":"https://x.example/h"}`, `{"tenant":"a","url":"u","events":["failed"]}`,
		`{"tenant":"A"}`, `{"tenant":"a","endpoint":"ep_1"}`, `{"tenant":"a","endpoint":"../x"}`, `[]`, `{"tenant":"a","events":["running"],"url":"u"}`} {
		for _, op := range []string{webhook.OpAdd, webhook.OpList, webhook.OpRemove, webhook.OpDeliveries} {
			f.Add(op, []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, op string, b []byte) {
		req, err := webhook.DecodeRequest(op, b)
		if err != nil {
			return
		}
		if !protocol.ValidTenant(req.Tenant) {
			t.Fatalf("accepted tenant %q", req.Tenant)
		}
		if req.Endpoint != "" && !protocol.ValidID(req.Endpoint) {
			t.Fatalf("accepted endpoint %q", req.Endpoint)
		}
		if op == webhook.OpAdd {
			if req.URL == "" {
				t.Fatal("add accepted without a url")
			}
			for _, e := range req.Events {
				if !slices.Contains(webhook.Events, e) {
					t.Fatalf("accepted event %q", e)
				}
			}
		}
		if op == webhook.OpRemove && req.Endpoint == "" {
			t.Fatal("rm accepted without an endpoint")
		}
	})
}
