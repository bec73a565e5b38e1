package tenancy

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func FuzzParseToken(f *testing.F) {
	kp, _ := nkeys.CreateAccount()
	payload, _ := json.Marshal(tokenClaims{Tenant: "acme", Issued: time.Now().Unix(), ID: "x"})
	sig, _ := kp.Sign(payload)
	f.Add("aft1_" + b64(payload) + "." + b64(sig))
	f.Add("aft1_e30.")
	f.Add("aft1_..")
	f.Add("")
	f.Add(`aft1_eyJ0IjoiYS4-IiwiaWF0IjoxfQ.AA`)
	f.Fuzz(func(t *testing.T, tok string) {
		c, p, _, err := parseToken(tok)
		if err != nil {
			return
		}
		if ValidTenant(c.Tenant) != nil || c.Issued <= 0 || len(p) == 0 {
			t.Fatalf("accepted %q with claims %+v", tok, c)
		}
	})
}

func FuzzParseCreds(f *testing.F) {
	acc, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	creds, _ := userCreds(user, acc, "tenant:a", nil, []string{"tenant:a"}, time.Hour)
	f.Add(creds)
	f.Add([]byte("-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		ci, err := ParseCreds(b)
		if err == nil && ci.Tenant != "" && ValidTenant(ci.Tenant) != nil {
			t.Fatalf("accepted tenant %q", ci.Tenant)
		}
	})
}

func FuzzScopeRequest(f *testing.F) {
	f.Add([]byte(`{"id":"q1","tenant":"b"}`))
	f.Add([]byte(`{"id":"q1","Tenant":"b","tenant":"a"}`))
	f.Add([]byte(`{"id":"q1","TENANT":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := ScopeRequest("a", b)
		if err != nil {
			return
		}
		// Whatever it let through decodes, as the handlers decode it, as a's.
		var ref struct{ Tenant string }
		if err := json.Unmarshal(out, &ref); err != nil || ref.Tenant != "a" {
			t.Fatalf("%q became %q (tenant %q, %v)", b, out, ref.Tenant, err)
		}
	})
}

func FuzzCheckConsumerCreate(f *testing.F) {
	f.Add("n1", "fleet.query.a.>", []byte(`{"stream_name":"FLEET_QUERIES","config":{"name":"n1","filter_subject":"fleet.query.a.>"}}`))
	f.Add("n1", "fleet.query.a.q.>", []byte(`{"config":{"Deliver_Subject":"x"}}`))
	f.Add("n1", "fleet.query.a.q.>", []byte(`{"config":{"deliver_ſubject":"x"}}`))
	f.Add("n1", "fleet.query.a.q.>", []byte("{\"config\":{\"durable_name\":\"x\",\"\u212a\":1}}"))
	f.Add("n1", "fleet.query.b.>", []byte(`{"config":{}}`))
	f.Add("n1", "", []byte(`{"config":{"filter_subject":"fleet.query.a.q1.>","deliver_policy":"by_start_sequence","opt_start_seq":5,"ack_policy":"none","num_replicas":1,"mem_storage":true,"inactive_threshold":1000}}`))
	f.Fuzz(func(t *testing.T, name, filter string, b []byte) {
		cc, err := CheckConsumerCreate("FLEET_QUERIES", name, filter, "fleet.query.a.", b)
		if err != nil {
			return
		}
		// What the proxy sends, read as nats-server reads it.
		var req server.CreateConsumerRequest
		if err := json.Unmarshal(cc.Body(), &req); err != nil {
			t.Fatalf("sent %q: %v", cc.Body(), err)
		}
		c := req.Config
		if c.DeliverSubject != "" || c.DeliverGroup != "" || c.Durable != "" || len(c.FilterSubjects) > 0 || c.AckPolicy != server.AckNone ||
			!strings.HasPrefix(c.FilterSubject, "fleet.query.a.") || c.Name != cc.Name || req.Action != server.ActionCreate || req.Stream != "FLEET_QUERIES" ||
			c.InactiveThreshold <= 0 || c.InactiveThreshold > maxInactive || c.MaxDeliver != 0 || len(c.Metadata) > 0 {
			t.Fatalf("let %q through as %q", b, cc.Body())
		}
		want := "CONSUMER.CREATE.FLEET_QUERIES." + cc.Name + "." + c.FilterSubject
		if cc.Subject() != want || strings.ContainsAny(cc.Name, ".*> ") {
			t.Fatalf("sends on %q, not %q", cc.Subject(), want)
		}
	})
}

func b64(b []byte) string {
	return strings.TrimRight(strings.NewReplacer("+", "-", "/", "_").Replace(stdB64(b)), "=")
}

func stdB64(b []byte) string { return base64Std.EncodeToString(b) }

var base64Std = base64.StdEncoding

func FuzzCheckMsgGet(f *testing.F) {
	f.Add([]byte(`{"last_by_subj":"fleet.query.a.q1.status"}`))
	f.Add([]byte(`{"last_by_subj":"fleet.query.b.q1.status"}`))
	f.Add([]byte(`{"seq":1}`))
	f.Add([]byte(`{"Seq":1,"last_by_subj":"fleet.query.a.q1.status"}`))
	f.Add([]byte(`{"last_by_subj":"fleet.query.a.>"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := CheckMsgGet("fleet.query.a.", b)
		if err != nil {
			return
		}
		var req server.JSApiMsgGetRequest
		if json.Unmarshal(out, &req) != nil || req.Seq != 0 || req.NextFor != "" || req.Batch != 0 || req.StartTime != nil ||
			!strings.HasPrefix(req.LastFor, "fleet.query.a.") || strings.ContainsAny(req.LastFor, "*> ") {
			t.Fatalf("let %q through as %q", b, out)
		}
	})
}

func FuzzScopeJob(f *testing.F) {
	f.Add([]byte(`{"id":"q1","prompt":"p"}`), "")
	f.Add([]byte(`{"id":"q1","prompt":"p","tenant":"b"}`), "")
	f.Add([]byte(`{"id":"q1","prompt":"p","Tenant":"b","tenant":"a"}`), "")
	f.Add([]byte{0x81, 0xa6, 't', 'e', 'n', 'a', 'n', 't', 0xa1, 'b'}, "application/msgpack")
	f.Fuzz(func(t *testing.T, b []byte, ct string) {
		out, err := ScopeJob("a", ct, b)
		if err != nil {
			return
		}
		var job struct{ Tenant string }
		if json.Unmarshal(out, &job) != nil || job.Tenant != "a" {
			t.Fatalf("%q (%s) became %q", b, ct, out)
		}
	})
}

func FuzzScopeSubmission(f *testing.F) {
	f.Add([]byte(`{"id":"q1","prompt":"p"}`), "", "a.q1", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add([]byte(`{"id":"q1","prompt":"p","tenant":"b"}`), "", "b.q1", "")
	f.Add([]byte(`{"id":"q1","prompt":"p","ſandbox":"x"}`), "", "", "x")
	f.Add([]byte{0x82, 0xa2, 'i', 'd', 0xa2, 'q', '1', 0xa6, 'p', 'r', 'o', 'm', 'p', 't', 0xa1, 'p'}, "application/msgpack", "q1", "")
	f.Fuzz(func(t *testing.T, b []byte, ct, msgID, traceparent string) {
		hdr := nats.Header{}
		hdr.Set(protocol.HeaderContentType, ct)
		hdr.Set(protocol.HeaderMsgID, msgID)
		hdr.Set("traceparent", traceparent)
		hdr.Set("Nats-Rollup", "all")
		s, err := ScopeSubmission("a", hdr, b)
		if err != nil {
			return
		}
		var job protocol.Job
		if json.Unmarshal(s.Body, &job) != nil || job.Tenant != "a" || job.ID == "" {
			t.Fatalf("%q became %q", b, s.Body)
		}
		if !strings.HasPrefix(s.Header.Get(protocol.HeaderMsgID), "a.") {
			t.Fatalf("message id %q", s.Header.Get(protocol.HeaderMsgID))
		}
		for k := range s.Header {
			switch k {
			case protocol.HeaderContentType, protocol.HeaderMsgID, "traceparent", "tracestate":
			default:
				t.Fatalf("kept header %s", k)
			}
		}
	})
}
