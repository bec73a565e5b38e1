package tenancy

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
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
	f.Add("n1", "fleet.query.b.>", []byte(`{"config":{}}`))
	f.Fuzz(func(t *testing.T, name, filter string, b []byte) {
		out, err := CheckConsumerCreate(name, filter, "fleet.query.a.", b)
		if err != nil {
			return
		}
		var req struct {
			Action string
			Config map[string]json.RawMessage
		}
		if json.Unmarshal(out, &req) != nil || req.Action != "create" || !strings.HasPrefix(filter, "fleet.query.a.") {
			t.Fatalf("let through %q for %q", out, filter)
		}
		for k := range req.Config {
			switch strings.ToLower(k) {
			case "deliver_subject", "deliver_group", "durable_name", "filter_subjects":
				t.Fatalf("let %s through: %q", k, out)
			}
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
	f.Add([]byte(`{"last_by_subj":"fleet.query.a.>"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if CheckMsgGet("fleet.query.a.", b) != nil {
			return
		}
		var req map[string]json.RawMessage
		if json.Unmarshal(b, &req) != nil || len(req) != 1 {
			t.Fatalf("let %q through", b)
		}
		var subj string
		if json.Unmarshal(req["last_by_subj"], &subj) != nil || !strings.HasPrefix(subj, "fleet.query.a.") {
			t.Fatalf("let %q through", b)
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
