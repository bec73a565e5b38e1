package envcache

import (
	"bufio"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseInputs(t *testing.T) {
	got, err := ParseInputs("#!/bin/sh\n# inputs: package-lock.json  tools/v.txt\n  #inputs:\tgo.sum package-lock.json\n# not inputs: x\nnpm ci # inputs: no\n")
	require.NoError(t, err)
	require.Equal(t, []string{"package-lock.json", "tools/v.txt", "go.sum"}, got)
	got, err = ParseInputs("make")
	require.NoError(t, err)
	require.Empty(t, got)
	for _, bad := range []string{"/etc/passwd", "../x", "a/../../x", "./a", "a//b", "..", ".", "a/\xff"} {
		_, err := ParseInputs("# inputs: ok " + bad)
		require.Error(t, err, bad)
		require.ErrorContains(t, err, "line 1", bad)
	}
	_, err = ParseInputs("# inputs:" + strings.Repeat(" f", 1) + func() string {
		var b strings.Builder
		for i := range MaxInputs + 1 {
			b.WriteString(" f" + string(rune('a'+i%26)) + strings.Repeat("x", i))
		}
		return b.String()
	}())
	require.ErrorContains(t, err, "more than")
}

// FuzzParseInputs: whatever the script, every input returned is a clean
// relative path inside the checkout that the script names, once.
func FuzzParseInputs(f *testing.F) {
	for _, s := range []string{"# inputs: a b/c", "#inputs:\t../x", "# inputs: /abs", "x\n # inputs: a a a\n", "# inputs: a/./b", "#  inputs: \x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, script string) {
		got, err := ParseInputs(script)
		if err != nil {
			return
		}
		require.LessOrEqual(t, len(got), MaxInputs)
		seen := map[string]bool{}
		for _, p := range got {
			require.NoError(t, checkInput(p))
			require.False(t, seen[p], "duplicate %q", p)
			seen[p] = true
			require.Contains(t, script, p)
		}
	})
}

// FuzzParseManifest: a damaged manifest is an error, never a panic, and
// one that parses lists clean paths whose sizes add up to its seal.
func FuzzParseManifest(f *testing.F) {
	f.Add(string(formatManifest([]item{{kind: 'f', mode: 0o644, size: 3, path: "a/b"}, {kind: 'd', mode: 0o755, path: "a"}})))
	f.Add("sealed 0 0\n")
	f.Add("f 644 3 \"a\"\nsealed 1 4\n")
	f.Add("f 644 3 \"../a\"\nsealed 1 3\n")
	f.Fuzz(func(t *testing.T, data string) {
		items, total, err := parseManifest(bufio.NewScanner(strings.NewReader(data)))
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		var sum int64
		for _, it := range items {
			require.NoError(t, checkRel(it.path, 4096))
			sum += it.size
		}
		require.Equal(t, total, sum)
	})
}
