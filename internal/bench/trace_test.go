package bench

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

var idTok = regexp.MustCompile(`\.d[0-9]+(\.|$)|_INBOX\.[A-Za-z0-9]+(\.[A-Za-z0-9]+)*|\$JS\.ACK\..*`)

func traceAll(t testing.TB, nc *nats.Conn) func() {
	if os.Getenv("BENCH_TRACE") == "" {
		return func() {}
	}
	var mu sync.Mutex
	counts := map[string]int{}
	sub, err := nc.Subscribe(">", func(m *nats.Msg) {
		k := idTok.ReplaceAllStringFunc(m.Subject, func(s string) string {
			switch {
			case s[0] == '_':
				return "_INBOX.*"
			case s[0] == '$':
				return "$JS.ACK.*"
			}
			return ".ID."
		})
		if i := strings.Index(string(m.Data), `"state":"`); i >= 0 && strings.HasSuffix(m.Subject, ".status") {
			st := string(m.Data[i+9:])
			k += " " + st[:strings.IndexByte(st, '"')]
		}
		if strings.HasPrefix(k, "_INBOX_") {
			k = "_INBOX_x"
		}
		if m.Reply != "" {
			k += " (reply)"
		}
		mu.Lock()
		counts[k]++
		mu.Unlock()
	})
	require.NoError(t, err)
	require.NoError(t, sub.SetPendingLimits(-1, -1))
	return func() {
		_ = sub.Unsubscribe()
		mu.Lock()
		defer mu.Unlock()
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
		for _, k := range keys {
			fmt.Printf("trace %6d %s\n", counts[k], k)
		}
	}
}
