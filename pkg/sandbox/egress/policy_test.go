package egress

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // Policy.String(), or "" for an error
	}{
		{`"none"`, `"none"`},
		{` "open" `, `"open"`},
		{`{"allow":["GitHub.com.","*.npmjs.org","localhost:8080","10.0.0.7","[::1]:9000","::1"]}`,
			`{"allow":["github.com","*.npmjs.org","localhost:8080","10.0.0.7","[::1]:9000","[::1]"]}`},
		{`"allow"`, ""},
		{`"closed"`, ""},
		{`{"allow":[]}`, ""},
		{`{"allow":"github.com"}`, ""},
		{`{"deny":["x"]}`, ""},
		{`{"allow":["x"],"deny":["y"]}`, ""},
		{`{"allow":["github.com:0"]}`, ""},
		{`{"allow":["github.com:70000"]}`, ""},
		{`{"allow":["github.com:08"]}`, ""},
		{`{"allow":["http://github.com"]}`, ""},
		{`{"allow":["a..b"]}`, ""},
		{`{"allow":["*"]}`, ""},
		{`{"allow":["fe80::1%eth0"]}`, ""},
		{`{"allow":[""]}`, ""},
		{`null`, ""},
		{`42`, ""},
	} {
		p, err := Parse([]byte(tc.in))
		if tc.want == "" {
			require.Error(t, err, tc.in)
			require.True(t, errors.Is(err, ErrInvalid), tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, p.String(), tc.in)
	}
}

func TestParseFlag(t *testing.T) {
	p, err := ParseFlag("none")
	require.NoError(t, err)
	require.Equal(t, None, p.Mode)
	p, err = ParseFlag(`{"allow":["example.com"]}`)
	require.NoError(t, err)
	require.Equal(t, Allow, p.Mode)
	_, err = ParseFlag("allow")
	require.ErrorIs(t, err, ErrInvalid)
}

func TestCheckMax(t *testing.T) {
	for _, m := range []Mode{None, Allow, Open} {
		for _, max := range []Mode{None, Allow, Open} {
			err := Policy{Mode: m}.CheckMax(max)
			if m <= max {
				require.NoError(t, err)
				continue
			}
			var na *NotAllowedError
			require.ErrorAs(t, err, &na)
			require.Equal(t, m, na.Asked)
			require.Contains(t, err.Error(), "--network-max")
		}
	}
	_, err := ParseMode("wide")
	require.Error(t, err)
}

func TestAdmits(t *testing.T) {
	p, err := Parse([]byte(`{"allow":["github.com","*.npmjs.org","localhost:8080","10.0.0.7:22","[::1]"]}`))
	require.NoError(t, err)
	for _, tc := range []struct {
		host string
		port int
		ok   bool
	}{
		{"github.com", 443, true},
		{"GitHub.com.", 80, true},
		{"github.com", 22, false},
		{"api.github.com", 443, false},
		{"registry.npmjs.org", 443, true},
		{"npmjs.org", 443, false},
		{"evilnpmjs.org", 443, false},
		{"localhost", 8080, true},
		{"localhost", 443, false},
		{"127.0.0.1", 8080, false}, // an IP literal never matches a name
		{"10.0.0.7", 22, true},
		{"10.0.0.7", 443, false},
		{"::1", 443, true},
		{"[::1]", 80, true},
		{"::ffff:10.0.0.7", 22, true},
	} {
		_, ok := p.Admits(tc.host, tc.port)
		require.Equal(t, tc.ok, ok, "%s:%d", tc.host, tc.port)
	}
	_, ok := Policy{Mode: None}.Admits("github.com", 443)
	require.False(t, ok)
	_, ok = Policy{Mode: Open}.Admits("github.com", 443)
	require.True(t, ok)
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{`"none"`, `"open"`, `{"allow":["github.com","*.a.b:8080","[::1]:1","10.0.0.1"]}`,
		`{"allow":[]}`, `{"allow":["a:b:c"]}`, `"x"`, `{}`, `[]`, `{"allow":["` + "\xff" + `"]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := Parse(raw)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		// What parses spells itself back into the same policy.
		q, err := Parse([]byte(p.String()))
		if err != nil {
			t.Fatalf("Parse(%q) = %s, which does not parse: %v", raw, p, err)
		}
		if p.String() != q.String() {
			t.Fatalf("round trip %s != %s", p, q)
		}
		if p.Mode == Allow && len(p.Allow) == 0 {
			t.Fatal("allow policy with no rules")
		}
	})
}

func TestForJob(t *testing.T) {
	def := Policy{Mode: None}
	p, err := ForJob(nil, def, Allow, Deny{})
	require.NoError(t, err)
	require.Equal(t, None, p.Mode, "absent takes the default")
	p, err = ForJob([]byte(" null "), def, Allow, Deny{})
	require.NoError(t, err)
	require.Equal(t, None, p.Mode)
	p, err = ForJob([]byte(`{"allow":["github.com"]}`), def, Allow, Deny{})
	require.NoError(t, err)
	require.Equal(t, Allow, p.Mode)
	_, err = ForJob([]byte(`"open"`), def, Allow, Deny{})
	var na *NotAllowedError
	require.ErrorAs(t, err, &na)
	_, err = ForJob([]byte(`"wide"`), def, Open, Deny{})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = ForJob(nil, Policy{Mode: Open}, Allow, Deny{})
	require.ErrorAs(t, err, &na, "a default above the maximum is refused too")
}
