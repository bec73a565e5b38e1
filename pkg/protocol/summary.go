package protocol

import "encoding/json"

// A terminal status's summaries carry every documented field, false and
// zero included: a consumer testing `pushed === false` or
// `total_cost_usd === 0` must find the field. The same types describe
// non-terminal states too (a running workspace names only its start_sha),
// so the encoders below tell a summary from the rest by what is set.

// MarshalJSON writes w; a terminal summary (one with an end_sha or a
// capture error) always holds start_sha, end_sha, files_changed, additions,
// deletions and pushed (docs/workspaces.md).
func (w WorkspaceStatus) MarshalJSON() ([]byte, error) {
	type plain WorkspaceStatus
	if w.EndSHA == "" && w.CaptureError == "" {
		return json.Marshal(plain(w))
	}
	return json.Marshal(struct {
		StartSHA     string `json:"start_sha"`
		EndSHA       string `json:"end_sha"`
		Branch       string `json:"branch,omitempty"`
		FilesChanged int    `json:"files_changed"`
		Additions    int    `json:"additions"`
		Deletions    int    `json:"deletions"`
		Pushed       bool   `json:"pushed"`
		PushError    string `json:"push_error,omitempty"`
		CaptureError string `json:"capture_error,omitempty"`
		Checkpoint   bool   `json:"checkpoint,omitempty"`
		Cache        string `json:"cache,omitempty"`
		CacheCold    string `json:"cache_cold,omitempty"`
	}{w.StartSHA, w.EndSHA, w.Branch, w.FilesChanged, w.Additions, w.Deletions, w.Pushed, w.PushError, w.CaptureError, w.Checkpoint, w.Cache, w.CacheCold})
}

// MarshalJSON writes r with its counts always present: subtype, is_error,
// num_turns, duration_ms and total_cost_usd, zero included. The order of
// the fields is ResultSummary's.
func (r ResultSummary) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Subtype      string          `json:"subtype"`
		IsError      bool            `json:"is_error"`
		NumTurns     int             `json:"num_turns"`
		DurationMS   int64           `json:"duration_ms"`
		TotalCostUSD float64         `json:"total_cost_usd"`
		SessionID    string          `json:"session_id,omitempty"`
		Errors       []string        `json:"errors,omitempty"`
		Usage        json.RawMessage `json:"usage,omitempty"`
		Synthetic    bool            `json:"synthetic,omitempty"`
		Lines        uint64          `json:"lines,omitempty"`
		LastSeq      uint64          `json:"last_seq,omitempty"`
		StderrTail   string          `json:"stderr_tail,omitempty"`
	}{r.Subtype, r.IsError, r.NumTurns, r.DurationMS, r.TotalCostUSD, r.SessionID, r.Errors, r.Usage, r.Synthetic, r.Lines, r.LastSeq, r.StderrTail})
}
