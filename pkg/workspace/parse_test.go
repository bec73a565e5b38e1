package workspace

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func TestParseDiff(t *testing.T) {
	t.Parallel()
	num := "3\t1\tsrc/a.go\x00-\t-\timg/p.bin\x000\t0\t\x00old name.txt\x00new\tname.txt\x000\t2\tdel.txt\x00"
	names := "M\x00src/a.go\x00A\x00img/p.bin\x00R100\x00old name.txt\x00new\tname.txt\x00D\x00del.txt\x00"
	files, err := parseDiff([]byte(num), []byte(names))
	require.NoError(t, err)
	require.Equal(t, []protocol.ArtifactFile{
		{Path: "src/a.go", Status: protocol.FileModified, Additions: 3, Deletions: 1},
		{Path: "img/p.bin", Status: protocol.FileAdded, Binary: true},
		{Path: "new\tname.txt", OldPath: "old name.txt", Status: protocol.FileRenamed},
		{Path: "del.txt", Status: protocol.FileDeleted, Deletions: 2},
	}, files)
	files, err = parseDiff(nil, nil)
	require.NoError(t, err)
	require.Empty(t, files)
}

// FuzzParseDiff: file names are the agent's, so git's output is outside
// input; the parser never panics and never lists more files than git named.
func FuzzParseDiff(f *testing.F) {
	f.Add([]byte("1\t2\ta\x00"), []byte("M\x00a\x00"))
	f.Add([]byte("0\t0\t\x00a\x00b\x00"), []byte("R090\x00a\x00b\x00"))
	f.Add([]byte("-\t-\tx\x00"), []byte("T\x00x\x00"))
	f.Fuzz(func(t *testing.T, num, names []byte) {
		files, err := parseDiff(num, names)
		if err != nil {
			return
		}
		require.LessOrEqual(t, len(files), strings.Count(string(names), "\x00")+1)
		for _, fl := range files {
			require.NotEmpty(t, fl.Status)
		}
	})
}

func TestParseCredentials(t *testing.T) {
	t.Parallel()
	c, err := ParseCredentials([]byte("# comment\n\nhttps://bot:p%40ss@git.example.com\nhttps://other:tok@git.example.com/team\nhttp://u:p@127.0.0.1:8080\n"))
	require.NoError(t, err)
	require.Equal(t, 3, c.Len())
	auth, ok := c.Authorization("https://git.example.com/team/repo.git")
	require.True(t, ok)
	require.Equal(t, "Basic b3RoZXI6dG9r", auth, "the longest path prefix wins")
	auth, ok = c.Authorization("https://git.example.com/else/repo.git")
	require.True(t, ok)
	require.Equal(t, "Basic Ym90OnBAc3M=", auth, "percent-decoded")
	_, ok = c.Authorization("https://git.example.com.evil/r.git")
	require.False(t, ok)
	_, ok = c.Authorization("http://git.example.com/r.git")
	require.False(t, ok, "the scheme must match")
	_, ok = c.Authorization("https://git.example.com/teamx/r.git")
	require.True(t, ok)
	key, _, ok := c.forRepo("http://127.0.0.1:8080/r.git")
	require.True(t, ok)
	require.Equal(t, "http.http://127.0.0.1:8080/.extraHeader", key)
	require.NotContains(t, c.String(), "tok")

	for _, bad := range []string{"not a url", "https://git.example.com", "ssh://u:p@h", "https://u@h"} {
		_, err := ParseCredentials([]byte(bad + "\n"))
		require.Error(t, err, bad)
	}
}

// FuzzParseCredentials: an operator's file; errors name the line, never echo it.
func FuzzParseCredentials(f *testing.F) {
	f.Add([]byte("https://u:secretvalue@h\n"))
	f.Add([]byte("https://u:secretvalue@h:99/p\n# x\nhttp://a:b@c"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCredentials(data)
		if err != nil {
			require.NotContains(t, err.Error(), "secretvalue")
			return
		}
		for _, e := range c.entries {
			if e.password != "" {
				require.NotContains(t, c.String(), ":"+e.password+"@")
			}
		}
	})
}
