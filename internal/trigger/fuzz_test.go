package trigger

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzRender: a webhook's body comes from anyone holding the secret, the
// template from the tenant; whatever they hold, a rendered job is the
// trigger's tenant's, with no id and no trigger of its own (a body's
// fields fill the template's strings only: fill never touches keys).
func FuzzRender(f *testing.F) {
	for _, c := range [][2]string{
		{`{"prompt":"Fix {{ .title }}"}`, `{"title":"bug"}`},
		{`{"prompt":"{{ .a }}","metadata":{"k":"{{ .b }}"}}`, `{"a":"x\",\"tenant\":\"other","b":1}`},
		{`{"prompt":"{{ .a }}","tenant":"other"}`, `{"a":"x"}`},
		{`{"prompt":"{{ index . \"a\" }}","id":"x"}`, `{"a":"x"}`},
		{`{"prompt":"{{ .a "}`, `{}`},
		{`[]`, `{}`},
	} {
		f.Add([]byte(c[0]), []byte(c[1]))
	}
	f.Fuzz(func(t *testing.T, tmpl, body []byte) {
		var fields map[string]any
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if dec.Decode(&fields) != nil {
			return
		}
		job, err := Render(tmpl, "acme", fields)
		if err != nil {
			return
		}
		if job.Tenant != "acme" || job.ID != "" || job.Trigger != nil {
			t.Fatalf("rendered %+v", job)
		}
	})
}

func TestSampleFieldsNamesEveryPlaceholder(t *testing.T) {
	got := sampleFields(json.RawMessage(`{"prompt":"{{ .a }} {{ if .b }}{{ .c.d }}{{ else }}{{ .e }}{{ end }}","metadata":{"k":"{{ range .f }}x{{ end }}"},"x":["{{ .g | printf \"%s\" }}"]}`))
	for _, k := range []string{"a", "b", "c", "e", "f", "g"} {
		if got[k] != "sample" {
			t.Errorf("field %q not found in %v", k, got)
		}
	}
}
