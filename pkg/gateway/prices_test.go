package gateway

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLookupMatchesDatedIDs(t *testing.T) {
	t.Parallel()
	ps := DefaultPrices()
	for model, want := range map[string]string{
		"claude-sonnet-5-5":            "claude-sonnet-5-5",
		"claude-sonnet-5-5-20261007":   "claude-sonnet-5-5",
		"Claude-Sonnet-5-5[1m]":        "claude-sonnet-5-5",
		"claude-3-5-haiku@20241022":    "claude-3-5-haiku",
		"claude-3-5-haiku-latest":      "claude-3-5-haiku",
		"claude-opus-4-1-20250805":     "claude-opus-4-1",
		"claude-opus-4-20250514":       "claude-opus-4",
		"claude-sonnet-4-5-20250929":   "claude-sonnet-4-5",
		"claude-haiku-5-5-preview-x":   "claude-haiku-5-5",
		"claude-opus-4-5-20251101[1m]": "claude-opus-4-5",
	} {
		got, known := ps.Lookup(model)
		require.True(t, known, model)
		require.Equal(t, ps[want], got, model)
	}
	got, known := ps.Lookup("gpt-9")
	require.False(t, known)
	require.Equal(t, ps[FallbackModel], got, "an unknown model is priced as the fallback")
	got, known = Prices{}.Lookup("x")
	require.False(t, known)
	require.Equal(t, DefaultPrices()[FallbackModel], got)
}

func TestCost(t *testing.T) {
	t.Parallel()
	ps := DefaultPrices()
	opus := ps["claude-opus-5-5"]
	// 5m writes at $5, 1h writes at $8.
	require.InDelta(t, (12*4+42*20+4000*0.20+100*5+200*8)/1e6, opus.Cost(streamUsage), 1e-12)
	haiku := ps["claude-haiku-5-5"]
	small := Usage{InputTokens: 20_000, CacheReadInputTokens: 80_000, OutputTokens: 1000}
	require.InDelta(t, (20_000*0.10+80_000*0.01+1000*0.50)/1e6, haiku.Cost(small), 1e-12)
	// Above 100k prompt tokens every token is priced at the long band.
	big := Usage{InputTokens: 20_000, CacheReadInputTokens: 90_000, OutputTokens: 1000}
	require.InDelta(t, (20_000*0.50+90_000*0.05+1000*2.50)/1e6, haiku.Cost(big), 1e-12)
	// A 1h count larger than the writes is bounded by them.
	require.InDelta(t, 10*8/1e6, opus.Cost(Usage{CacheCreationInputTokens: 10, CacheCreation1h: 99}), 1e-12)
	require.InDelta(t, 10*2.0/1e6, Price{CacheWrite: 2}.Cost(Usage{CacheCreationInputTokens: 10, CacheCreation1h: 10}), 1e-12)
}

func TestLoadPrices(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "prices.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"claude-new-6-0-20270101":{"input":1,"output":2,"cache_read":0.1,"cache_write":1.25},
		"claude-opus-5-5":{"input":3,"output":15,"cache_read":0.3,"cache_write":3.75}}`), 0o600))
	ps, err := LoadPrices(file)
	require.NoError(t, err)
	p, known := ps.Lookup("claude-new-6-0-20270315")
	require.True(t, known)
	require.Equal(t, Price{Input: 1, Output: 2, CacheRead: 0.1, CacheWrite: 1.25}, p)
	require.Equal(t, 3.0, ps["claude-opus-5-5"].Input, "an entry replaces the built-in one")
	require.Equal(t, DefaultPrices()["claude-haiku-5-5"], ps["claude-haiku-5-5"], "the others stay")

	for name, body := range map[string]string{
		"negative":     `{"m":{"input":-1}}`,
		"not a number": `{"m":{"input":"1"}}`,
		"not a map":    `[1]`,
		"null":         `null`,
		"empty name":   `{"":{"input":1}}`,
		"long of long": `{"m":{"long_above":5,"long":{"long":{}}}}`,
		"bad long":     `{"m":{"long_above":5,"long":{"output":-2}}}`,
		"negative cut": `{"m":{"long_above":-5}}`,
		"trailing":     `{"m":{}} x`,
	} {
		_, err := ParsePrices([]byte(body))
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "model prices", name)
	}
	_, err = LoadPrices(filepath.Join(dir, "missing.json"))
	require.ErrorContains(t, err, "missing.json")
}

func FuzzParsePrices(f *testing.F) {
	f.Add([]byte(`{"claude-x":{"input":1,"output":2,"cache_read":0.1,"cache_write":1.25}}`))
	f.Add([]byte(`{"claude-x":{"long_above":10,"long":{"input":1}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ps, err := ParsePrices(b)
		if err != nil {
			return
		}
		for m, p := range ps {
			require.GreaterOrEqual(t, p.Cost(Usage{InputTokens: 1e6, OutputTokens: 1, CacheReadInputTokens: 1, CacheCreationInputTokens: 1e7}), 0.0, m)
		}
	})
}
