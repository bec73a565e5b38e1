package sandbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTailBuffer(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		max    int
		writes []string
		want   string
	}{
		"under the limit":      {max: 10, writes: []string{"abc", "def"}, want: "abcdef"},
		"exactly the limit":    {max: 6, writes: []string{"abc", "def"}, want: "abcdef"},
		"drops the oldest":     {max: 4, writes: []string{"abc", "def"}, want: "cdef"},
		"one big write":        {max: 3, writes: []string{"abcdefgh"}, want: "fgh"},
		"big write after data": {max: 3, writes: []string{"xy", "abc"}, want: "abc"},
		"many small writes":    {max: 5, writes: strings.Split("abcdefghijklmnop", ""), want: "lmnop"},
		// "é" is 2 bytes: cutting inside it leaves a lone continuation byte.
		"trims a cut rune":  {max: 4, writes: []string{"aé", "xyz"}, want: "xyz"},
		"keeps whole runes": {max: 5, writes: []string{"aé", "xyz"}, want: "éxyz"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tb := &tailBuffer{max: tc.max}
			for _, w := range tc.writes {
				n, err := tb.Write([]byte(w))
				require.NoError(t, err)
				require.Equal(t, len(w), n)
			}
			require.Equal(t, tc.want, tb.String())
		})
	}
}
