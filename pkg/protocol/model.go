package protocol

// ModelEvent is the JSON object published on
// <prefix>.query.<tenant>.<id>.model for each model call the gateway (or
// the Cloudflare bridge's egress) answered (docs/gateway.md). Call counts from 1 per
// query across attempts.
type ModelEvent struct {
	Call                     int     `json:"call"`
	Attempt                  int     `json:"attempt"`
	Model                    string  `json:"model"`
	InputTokens              int64   `json:"input_tokens"`
	OutputTokens             int64   `json:"output_tokens"`
	CacheReadInputTokens     int64   `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int64   `json:"cache_creation_input_tokens"`
	CostUSD                  float64 `json:"cost_usd"`
	Status                   int     `json:"status"`
	MS                       int64   `json:"ms"`
}
