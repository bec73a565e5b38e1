package repocache

import (
	"strings"
	"testing"
)

func TestParseLsRemotePrefersThePeeledTag(t *testing.T) {
	a, b, c := strings.Repeat("a", 40), strings.Repeat("b", 40), strings.Repeat("c", 40)
	out := a + "\trefs/tags/v1\n" + b + "\trefs/tags/v1^{}\n" + c + "\trefs/heads/main\n"
	if sha, ok := parseLsRemote(out, "v1"); !ok || sha != b {
		t.Fatalf("v1: %s %v", sha, ok)
	}
	if sha, ok := parseLsRemote(out, "main"); !ok || sha != c {
		t.Fatalf("main: %s %v", sha, ok)
	}
	if _, ok := parseLsRemote(out, "nope"); ok {
		t.Fatal("a ref the remote did not list resolved")
	}
	if _, ok := parseLsRemote("zzz\trefs/heads/x\n", "x"); ok {
		t.Fatal("a line whose id is not a commit id resolved")
	}
}

// FuzzParseLsRemote: whatever a remote answers, the parse returns a
// commit id or nothing, and never panics.
func FuzzParseLsRemote(f *testing.F) {
	f.Add(strings.Repeat("a", 40)+"\trefs/heads/main\n", "main")
	f.Add(strings.Repeat("b", 40)+"\tHEAD\n\n\t\t", "HEAD")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, out, ask string) {
		if sha, ok := parseLsRemote(out, ask); ok && !IsSHA(sha) {
			t.Fatalf("%q is not a commit id", sha)
		}
	})
}
