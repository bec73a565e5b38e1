package strictjson

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

type inner struct {
	Subject string `json:"deliver_subject"`
}

type outer struct {
	Name   string            `json:"name"`
	Kind   string            `json:"kind,omitempty"`
	Inner  *inner            `json:"inner"`
	List   []inner           `json:"list"`
	Meta   map[string]string `json:"meta"`
	When   *time.Time        `json:"when"`
	Plain  int
	hidden int    // not a JSON field
	Skip   string `json:"-"`
}

func TestDecodeRefuses(t *testing.T) {
	for _, tc := range []struct{ in, why string }{
		{`{"NAME":"x"}`, "unknown field"},
		{`{"Name":"x"}`, "unknown field"},
		{`{"inner":{"deliver_ſubject":"x"}}`, "unknown field"},
		{`{"inner":{"deliver_\u017fubject":"x"}}`, "unknown field"},
		{`{"inner":{"DELIVER_SUBJECT":"x"}}`, "unknown field"},
		{"{\"\u212aind\":\"x\"}", "unknown field"},
		{`{"list":[{"deliver_subject":"a","Deliver_subject":"b"}]}`, "unknown field"},
		{`{"name":"a","name":"b"}`, "given twice"},
		{`{"meta":{"k":"a","k":"b"}}`, "given twice"},
		{`{"other":1}`, "unknown field"},
		{`{"Skip":"x"}`, "unknown field"},
		{`{"hidden":1}`, "unknown field"},
		{`{"name":"a"} {}`, "after the JSON value"},
		{`{"name":1}`, "cannot unmarshal"},
		{`{"name":"a"`, "invalid JSON"},
		{strings.Repeat("[", 40) + strings.Repeat("]", 40), "nested"},
	} {
		var v outer
		err := Decode([]byte(tc.in), &v)
		if err == nil || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s: got %v, want %q", tc.in, err, tc.why)
		}
	}
}

func TestDecodeAccepts(t *testing.T) {
	var v outer
	in := `{"name":"n","kind":"k","inner":{"deliver_subject":"s"},"list":[{"deliver_subject":"l"}],"meta":{"Any":"1","any":"2"},"when":"2026-01-02T03:04:05Z","Plain":3}`
	if err := Decode([]byte(in), &v); err != nil {
		t.Fatal(err)
	}
	v.hidden++ // unexported: never a JSON field
	if v.Name != "n" || v.Inner.Subject != "s" || v.List[0].Subject != "l" || v.Meta["Any"] != "1" || v.Plain != 3 || v.When.Year() != 2026 {
		t.Fatalf("%+v", v)
	}
}

// FuzzDecode: whatever Decode accepts has only keys that are byte-exactly
// field names, each once: re-decoding it leniently gives the same value.
var typeOfOuter = reflect.TypeFor[outer]()

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"name":"n","inner":{"deliver_subject":"s"}}`))
	f.Add([]byte(`{"inner":{"deliver_ſubject":"x"}}`))
	f.Add([]byte(`{"name":"a","name":"b"}`))
	f.Add([]byte(`{"meta":{"k":"a"},"list":[{}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var strict outer
		if Decode(b, &strict) != nil {
			return
		}
		var keys any
		if err := json.Unmarshal(b, &keys); err != nil {
			t.Fatalf("accepted invalid JSON %q", b)
		}
		m, ok := keys.(map[string]any)
		if !ok {
			return
		}
		for k := range m {
			if _, ok := fieldsOf(typeOfOuter)[k]; !ok {
				t.Fatalf("accepted key %q in %q", k, b)
			}
		}
		if in, ok := m["inner"].(map[string]any); ok {
			for k := range in {
				if k != "deliver_subject" {
					t.Fatalf("accepted inner key %q in %q", k, b)
				}
			}
		}
	})
}
