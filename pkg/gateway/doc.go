// Package gateway is the worker's model gateway (docs/gateway.md): an HTTP server on
// loopback that passes the Anthropic Messages API through to the model
// upstream, so that the agent never holds the worker's model credential,
// every model call is metered, and a run's spend is capped while it runs.
//
// # Tokens
//
// The worker opens a token per run (Open) and gives the agent
// ANTHROPIC_BASE_URL = the gateway's URL and ANTHROPIC_API_KEY = the token.
// A request carries it in x-api-key (or as a bearer token); the gateway
// removes it and adds the worker's real credential (x-api-key, or a bearer
// OAuth token). A request with no token, an unknown one or a closed one
// (Close) gets 401 and is never forwarded. Tokens are looked up by their
// SHA-256, never compared as strings.
//
// # Forwarding
//
// The gateway serves exact routes only (route.go): POST /v1/messages
// (forwarded and metered), POST /v1/messages/count_tokens, GET /v1/models
// and GET /v1/models/{id} ({id} lower-case letters and digits joined by
// single '-', '_' or '.'). The request-target is checked as the agent sent
// it, before any match: decoded again and again until it stops changing,
// no layer may hold a "." or ".." segment, a backslash, a ';', a control
// character or an encoded slash, and the raw path must be clean; such a
// target gets 400 (invalid_request_error), any other path or method 404
// (not_found_error), never forwarded, so the worker's credential reaches
// nothing else of the API (files, batches, organizations). The upstream
// URL is built from the matched route, never from the agent's path; the
// query keeps only the route's known parameters (beta=true|false; limit,
// after_id, before_id on the model list), checked and re-encoded. Headers
// upstream are an allow-list: anthropic-version, anthropic-beta,
// content-type, accept, user-agent, x-app, x-claude-code-session-id,
// anthropic-dangerous-direct-browser-access and x-stainless-*; the
// agent's x-api-key, authorization, cookies, forwarding and workspace
// headers are dropped, and the gateway sets the credential. The transport
// asks for gzip itself and hands on the decoded bytes. The answer's status,
// headers and body pass back byte for byte, each chunk written and flushed
// as it arrives. If the upstream breaks off mid-stream, the agent's
// connection is broken too; if the agent goes, or the run's token is
// closed, the upstream request is cancelled.
//
// # Metering
//
// Usage is read from the stream as it passes (an incremental SSE decoder
// that keeps only the data of message_start, message_delta and error
// events: per field, message_delta's cumulative value if present, else
// message_start's) or from a non-streaming message's usage. It is priced
// with Prices (built in, overridable with --model-prices) and published
// as one Event per call through Publisher: call numbers start at
// RunInfo.FirstCall. A call the gateway itself refuses (401, 402, 404) is
// no call. Close returns the run's metered Summary, which is what the
// terminal status reports as total_cost_usd.
//
// # Caps
//
// Before a metered call the gateway checks RunInfo.MaxCostUSD against the
// run's spend and RunInfo.TenantBudget against the live spend of the
// tenant's runs open here. A cap that is reached refuses the call with
// 402 billing_error and x-should-retry: false (Claude Code stops on it),
// and RunInfo.OnCap is called once: after the call whose cost crossed the
// cap (that call was the last forwarded) or at the first refusal. Calls in
// flight when a cap is crossed finish.
//
// # Rate limits
//
// An upstream 429 or 529 is passed through unchanged and reported to
// Config.OnRateLimit with the time its headers say to retry.
//
// # Wiring it into the worker
//
// Done in cmd/worker (model.go) and internal/worker (model.go), as follows.
//
//   - cmd/worker: flags --model-upstream (FLEET_MODEL_UPSTREAM) and
//     --model-prices (FLEET_MODEL_PRICES, LoadPrices); Config.
//     CredentialsFromEnv(os.Getenv); Start before the first claim, Stop
//     after the last run ends. Drop CredentialEnv and ANTHROPIC_BASE_URL
//     from --agent-env's default and refuse them in it, and add
//     IsCredentialEnv to the names procscrub.Scrub masks in main.go.
//   - Per run (a one-shot attempt, or a session while it lives on this
//     worker): token, url := gw.Open(RunInfo{…, FirstCall:
//     LastCall(…).Call+1, MaxCostUSD: *job.MaxCostUSD, TenantBudget: …,
//     OnCap: cancel the run's context with a budget cause}); the agent's
//     ProcSpec.Env gets ANTHROPIC_BASE_URL=url and ANTHROPIC_API_KEY=token;
//     at the run's end (or the session's park) sum := gw.Close(token).
//   - The terminal status: result.total_cost_usd = sum.CostUSD (plus the
//     query's earlier spend for a session or retry); a run cancelled with
//     the budget cause ends failed, error.code protocol.CodeBudget,
//     message sum.Capped.Message().
//   - Config.Publisher = JetStreamPublisher{JS, Names}; Config.OnRateLimit
//     publishes RateLimit.AdmissionLine on Names.RateLimitSubject(tenant).
//
// # Lifecycle
//
// Start listens and serves; Stop cuts off calls in flight and waits for
// every goroutine the gateway started. The gateway never logs tokens,
// keys or bodies.
package gateway
