package sandbox

import (
	"errors"
	"testing"
)

// FuzzCloudflareModelReport feeds the bridge's model report decoder
// arbitrary answers: it never panics, a refused answer wraps
// ErrUnavailable (asked again), and an accepted one moves the cursor by its
// calls with no negative or non-finite figure.
func FuzzCloudflareModelReport(f *testing.F) {
	f.Add([]byte(`{"events":[{"call":3,"attempt":1,"model":"m","input_tokens":1,"output_tokens":2,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"cost_usd":0.01,"status":200,"ms":5}],"next":1,"spent_usd":0.01,"capped":false}`), 0)
	f.Add([]byte(`{"events":[],"next":4,"spent_usd":0,"max_cost_usd":1,"capped":true}`), 4)
	f.Add([]byte(`{"events":[{"call":0}],"next":1}`), 0)
	f.Add([]byte(`{"next":-1}`), 0)
	f.Add([]byte(`{"spent_usd":-1}`), 0)
	f.Add([]byte(`not json`), 0)
	f.Fuzz(func(t *testing.T, b []byte, from int) {
		if from < 0 || from > 1<<20 {
			return
		}
		rep, err := decodeModelReport(b, from)
		if err != nil {
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("a refused report must wrap ErrUnavailable: %v", err)
			}
			return
		}
		if rep.Next < from || (len(rep.Calls) > 0 && rep.Next != from+len(rep.Calls)) {
			t.Fatalf("cursor %d after %d calls from %d", rep.Next, len(rep.Calls), from)
		}
		if !finiteNonNeg(rep.SpentUSD) || !finiteNonNeg(rep.MaxCostUSD) {
			t.Fatalf("bad figures: %+v", rep)
		}
		for _, c := range rep.Calls {
			if c.Call < 1 || !finiteNonNeg(c.CostUSD) || c.InputTokens < 0 || c.OutputTokens < 0 {
				t.Fatalf("bad call: %+v", c)
			}
		}
	})
}
