// Package cfkv is the storage.Store backend for Cloudflare Workers KV,
// through the REST API with cloudflare-go/v4 (v4.6.0). It is meant for
// status records: small values, written now and then, read by people and
// dashboards. Transcripts belong in R2 (package s3) or on NATS.
//
// # URL and credentials
//
//	cfkv://<account_id>/<namespace_id>[?endpoint=<API base URL>&budget=<requests per 5 min>&ttl=<duration>]
//
// The API token comes from CLOUDFLARE_API_TOKEN (an account token with
// "Workers KV Storage: Edit"); it is sent as a bearer token and never
// logged. endpoint defaults to https://api.cloudflare.com/client/v4/ and
// exists for proxies and test servers. budget is this process's share of
// the account's request budget (default 1200, see below). ttl makes every
// key expire (at least 60s; default: never). Open parses the URL; New takes
// a Config with an explicit token, endpoint and HTTP client.
//
// # What is supported
//
//   - Put, Get, Delete (a missing key is not an error), List (the keys
//     endpoint, prefix filter, cursor pagination, sorted; names that are not
//     valid storage keys are skipped), Close.
//   - Optional per-key metadata (Config.Metadata, ≤ 1024 bytes of JSON) and
//     expiration_ttl (Config.ExpirationTTL).
//   - Limits checked before sending: value ≤ 25 MiB (storage.ErrTooLarge),
//     key ≤ 512 bytes (storage.ValidateKey allows 480).
//   - Errors: 404 → storage.ErrNotFound; 413 → ErrTooLarge; 414 →
//     ErrInvalidKey; 408, 409, 429, 5xx and transport failures are retried
//     (Config.MaxRetries, honouring Retry-After up to MaxRetryAfter,
//     exponential backoff with jitter otherwise) and then wrap
//     ErrUnavailable; 400/401/403 fail at once. *APIError carries the
//     status and the envelope's error codes.
//
// Not supported: storage.Creator — KV has no conditional write (no
// If-None-Match, no compare-and-set), so a check-then-write would be a lie;
// use the s3 backend or NATS KV for write-once objects. storage.StreamPutter
// — values are bounded and small by design. Strong consistency — KV is
// eventually consistent: a write is visible at once where it was made and
// may take 60 s or more elsewhere, so List and Get from another place can
// lag.
//
// # Writes: coalescing and rate limits
//
// KV allows one write per key per second (faster writes get 429), and the
// REST API counts against the account-wide limit of 1,200 requests per 5
// minutes per token; going over blocks every API call of the account for
// minutes. So writes never go straight to the API:
//
//   - Put and Delete hand their operation to a per-Store coalescer and wait.
//     Per key, only the latest operation is kept (latest wins): a Put
//     returns once its value, or a newer value or delete of the same key,
//     has been written. A Put whose context ends before its value was sent
//     is withdrawn unless an older Put of the key still waits on it.
//   - One flusher goroutine sends the writes, in rounds. A key is written at
//     most once per Config.KeyWriteInterval (default 1.1 s), measured from
//     the end of its previous write to the start of the next, so the server
//     never sees two writes of a key closer than that.
//   - Keys ready in the same round share one request: PUT …/bulk (values
//     base64-encoded, ≤ 10,000 pairs, ≤ 90 MB) or POST …/bulk/delete. Keys
//     the API lists as unsuccessful are put back in line (merged with any
//     newer value) and retried in a later round.
//   - Every request, reads included, first takes a token from a token
//     bucket (golang.org/x/time/rate) of Config.Burst tokens refilled at
//     (Budget-Burst)/BudgetWindow, so no window of BudgetWindow ever holds
//     more than Budget requests. The budget is per Store: processes sharing
//     a token must split it (the budget URL parameter).
//   - Close stops accepting writes, lets the flusher send what is pending
//     for up to Config.CloseTimeout, then fails the rest with ErrClosed.
//
// # Traps, and how they are avoided
//
//   - cloudflare-go v4's generated Values.Update marshals its params as
//     JSON, so KV stores {"value":"…","metadata":…} instead of the value
//     (cloudflare-go#3911; v5+ send multipart). Every single-key write
//     passes the body with option.WithRequestBody: the raw bytes
//     (application/octet-stream) or, with metadata, a hand-built
//     multipart/form-data with "value" and "metadata" fields. The query
//     parameters (expiration_ttl) still come from the params struct.
//   - cloudflare-go builds the path with fmt.Sprintf and does not escape the
//     key: "status/t/q.json" would become three path segments (a 404) and
//     '?' or '#' would cut the path. Every key goes through url.PathEscape,
//     so '/' travels as %2F.
//   - cloudflare.NewClient reads CLOUDFLARE_API_KEY, _EMAIL, _BASE_URL and
//     more from the environment; the KV services are built with explicit
//     options only.
//   - The SDK's built-in retries sleep without watching the context; they
//     are turned off (option.WithMaxRetries(0)) in favour of call's retries.
//
// # Tests
//
// Package kvfake is a Go fake of the KV REST API that enforces the
// documented behaviour (bearer auth, byte-exact raw values, one escaped
// path segment per key, size limits, one write per key per interval with
// 429, an optional account budget with 429 and Retry-After, bulk writes
// with unsuccessful_keys, cursor listing). The shared storagetest.Exercise
// suite runs against it.
package cfkv
