package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
)

// Price is what one model costs, in dollars per million tokens of each kind.
type Price struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cache_read"`
	CacheWrite float64 `json:"cache_write"`
	// CacheWrite1h prices cache writes with a one-hour lifetime (the
	// message_start usage's cache_creation.ephemeral_1h_input_tokens);
	// 0 means CacheWrite.
	CacheWrite1h float64 `json:"cache_write_1h,omitempty"`
	// LongAbove and Long make a second band: a request whose prompt
	// (input + cache reads + cache writes) is above LongAbove tokens is
	// priced at Long in full, output included. 0 means one band.
	LongAbove int64  `json:"long_above,omitempty"`
	Long      *Price `json:"long,omitempty"`
}

// Prices maps a model id (without a date suffix) to its price.
type Prices map[string]Price

// FallbackModel prices a model the table does not know, as Claude Code
// itself does (an unknown id is billed at the default model's rates): a
// cap overestimates rather than lets an unknown model run free.
const FallbackModel = "claude-opus-5-5"

// DefaultPrices is the built-in table, in dollars per million tokens.
//
// Where the figures come from (read 2026-11-26): the 5.5 models from
// Anthropic's model pages on platform.claude.com (docs/*/models/opus-5-5,
// sonnet-5-5, haiku-5-5 overview) and from the rates Claude Code 2.1.330
// itself applies (fed synthetic usage, its costUSD read back); Sonnet
// 5.5's cache read is the CLI's 0.10 (the docs snapshot said 0.20 before
// the 2026-10-07 cut); Fable 5.2 is the CLI's figure only (unverified).
// The 4.x and 3.x models are Anthropic's published list prices
// (anthropic.com/pricing, docs "Pricing" page) as of 2025. Every one can be
// overridden with --model-prices; see LoadPrices.
func DefaultPrices() Prices {
	sonnet := Price{Input: 3, Output: 15, CacheRead: 0.30, CacheWrite: 3.75, CacheWrite1h: 6}
	opus4 := Price{Input: 15, Output: 75, CacheRead: 1.50, CacheWrite: 18.75, CacheWrite1h: 30}
	return Prices{
		"claude-opus-5-5":   {Input: 4, Output: 20, CacheRead: 0.20, CacheWrite: 5, CacheWrite1h: 8},
		"claude-sonnet-5-5": {Input: 2, Output: 10, CacheRead: 0.10, CacheWrite: 2.50, CacheWrite1h: 4},
		"claude-haiku-5-5": {Input: 0.10, Output: 0.50, CacheRead: 0.01, CacheWrite: 0.125, CacheWrite1h: 0.20,
			LongAbove: 100_000, Long: &Price{Input: 0.50, Output: 2.50, CacheRead: 0.05, CacheWrite: 0.625, CacheWrite1h: 1}},
		"claude-fable-5-2":  {Input: 8, Output: 40, CacheRead: 0.20, CacheWrite: 10, CacheWrite1h: 16},
		"claude-opus-4-5":   {Input: 5, Output: 25, CacheRead: 0.50, CacheWrite: 6.25, CacheWrite1h: 10},
		"claude-opus-4-1":   opus4,
		"claude-opus-4":     opus4,
		"claude-sonnet-4-5": sonnet,
		"claude-sonnet-4":   sonnet,
		"claude-3-7-sonnet": sonnet,
		"claude-3-5-sonnet": sonnet,
		"claude-haiku-4-5":  {Input: 1, Output: 5, CacheRead: 0.10, CacheWrite: 1.25, CacheWrite1h: 2},
		"claude-3-5-haiku":  {Input: 0.80, Output: 4, CacheRead: 0.08, CacheWrite: 1, CacheWrite1h: 1.6},
		"claude-3-opus":     opus4,
		"claude-3-haiku":    {Input: 0.25, Output: 1.25, CacheRead: 0.03, CacheWrite: 0.30, CacheWrite1h: 0.50},
	}
}

// LoadPrices reads a --model-prices file, JSON
// {"<model>":{"input","output","cache_read","cache_write"}} in dollars per
// million tokens, and returns the built-in table with its entries added or
// replaced. A price that is negative, NaN or infinite is an error naming it.
func LoadPrices(path string) (Prices, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model prices: %w", err)
	}
	return ParsePrices(b)
}

// ParsePrices is LoadPrices on the file's bytes.
func ParsePrices(b []byte) (Prices, error) {
	var over Prices
	if err := json.Unmarshal(b, &over); err != nil {
		return nil, fmt.Errorf("model prices: %w", err)
	}
	if over == nil {
		return nil, errors.New("model prices: want a JSON object of models")
	}
	out := DefaultPrices()
	for model, p := range over {
		if model == "" {
			return nil, errors.New("model prices: an empty model name")
		}
		if err := p.check(model); err != nil {
			return nil, err
		}
		out[normalise(model)] = p
	}
	return out, nil
}

func (p Price) check(model string) error {
	for name, v := range map[string]float64{"input": p.Input, "output": p.Output, "cache_read": p.CacheRead,
		"cache_write": p.CacheWrite, "cache_write_1h": p.CacheWrite1h} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("model prices: %s: %s must be a finite number >= 0, got %g", model, name, v)
		}
	}
	if p.LongAbove < 0 {
		return fmt.Errorf("model prices: %s: long_above must be >= 0", model)
	}
	if p.Long != nil {
		if p.Long.Long != nil {
			return fmt.Errorf("model prices: %s: long may not have a band of its own", model)
		}
		return p.Long.check(model + ".long")
	}
	return nil
}

// dateSuffix matches the date a dated model id ends with
// (claude-sonnet-4-5-20250929, claude-3-5-haiku@20241022) and the
// context-window marker Claude Code appends ([1m]).
var dateSuffix = regexp.MustCompile(`([-@]\d{8}|-latest|\[[0-9a-z]+\])$`)

// normalise lower-cases a model id and strips its date suffix.
func normalise(model string) string {
	m := strings.ToLower(strings.TrimSpace(model))
	for {
		n := dateSuffix.ReplaceAllString(m, "")
		if n == m {
			return m
		}
		m = n
	}
}

// Lookup returns the price of model: its exact entry, else the entry of
// the id without its date suffix, else the longest entry the id extends
// ("claude-opus-4-1-foo" → "claude-opus-4-1"), else FallbackModel's.
// known is false when the fallback was used.
func (ps Prices) Lookup(model string) (p Price, known bool) {
	if p, ok := ps[model]; ok {
		return p, true
	}
	m := normalise(model)
	if p, ok := ps[m]; ok {
		return p, true
	}
	best := ""
	for k := range ps {
		if len(k) > len(best) && strings.HasPrefix(m, k+"-") {
			best = k
		}
	}
	if best != "" {
		return ps[best], true
	}
	if p, ok := ps[FallbackModel]; ok {
		return p, false
	}
	return DefaultPrices()[FallbackModel], false
}

// Cost prices one call's usage in dollars.
func (p Price) Cost(u Usage) float64 {
	if p.Long != nil && p.LongAbove > 0 && u.InputTokens+u.CacheReadInputTokens+u.CacheCreationInputTokens > p.LongAbove {
		p = *p.Long
	}
	w1h := p.CacheWrite1h
	if w1h == 0 {
		w1h = p.CacheWrite
	}
	write1h := min(max(u.CacheCreation1h, 0), u.CacheCreationInputTokens)
	write5m := u.CacheCreationInputTokens - write1h
	return (float64(u.InputTokens)*p.Input + float64(u.OutputTokens)*p.Output +
		float64(u.CacheReadInputTokens)*p.CacheRead + float64(write5m)*p.CacheWrite +
		float64(write1h)*w1h) / 1e6
}
