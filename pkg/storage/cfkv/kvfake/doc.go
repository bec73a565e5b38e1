// Package kvfake is an in-memory fake of the Cloudflare Workers KV REST API
// (client/v4 …/storage/kv/namespaces/{ns}/…), for tests. No emulator of the
// REST API exists (Miniflare emulates the Worker binding, and Cloudflare
// said it has no plans to emulate the API: workers-sdk#2287), so this is
// written from the API reference, the cloudflare-go v4.6.0 request shapes
// and the documented limits.
//
// It serves, with or without the "/client/v4" base path:
//
//	PUT    /accounts/{a}/storage/kv/namespaces/{n}/values/{key}   raw body, or multipart "value"+"metadata"; ?expiration_ttl= ?expiration=
//	GET    /accounts/{a}/storage/kv/namespaces/{n}/values/{key}   raw bytes; 404 when missing
//	DELETE /accounts/{a}/storage/kv/namespaces/{n}/values/{key}   200 even when missing
//	GET    /accounts/{a}/storage/kv/namespaces/{n}/metadata/{key}
//	GET    /accounts/{a}/storage/kv/namespaces/{n}/keys           ?prefix= &limit= (10…1000) &cursor=
//	PUT    /accounts/{a}/storage/kv/namespaces/{n}/bulk           [{key,value,base64,expiration,expiration_ttl,metadata}]
//	POST   /accounts/{a}/storage/kv/namespaces/{n}/bulk/delete    ["key",…]
//
// What it enforces, like Cloudflare:
//
//   - Authorization: Bearer <token>, compared in constant time (403 with
//     error code 10000 otherwise).
//   - Values are stored byte for byte as received: a raw PUT body is the
//     value, so a client that sends {"value":"…"} JSON (cloudflare-go v4's
//     generated Update, cloudflare-go#3911) gets that JSON back.
//   - The key is exactly one escaped path segment, unescaped with
//     url.PathUnescape from r.URL.EscapedPath(); an unescaped '/' makes extra
//     segments and the route does not match (404, code 7003 "No route for
//     the URI", the code of Cloudflare's common failure example).
//   - Key ≤ 512 bytes (414), value ≤ 25 MiB (413), metadata ≤ 1024 bytes and
//     valid JSON (400), expiration_ttl ≥ 60 (400); bulk ≤ 10,000 items and
//     100 MB.
//   - At most one write (PUT or DELETE) per key per WriteInterval (default
//     1 s): a faster write gets 429 with Retry-After, and a bulk item
//     becomes one of the response's unsuccessful_keys.
//   - Optionally, an account budget of Budget requests per BudgetWindow
//     (Cloudflare: 1,200 per 5 minutes): beyond it every request gets 429,
//     error code 971 ("Please wait and consider throttling your request
//     speed", the code Cloudflare's API returns, see workers-sdk#10025) and
//     Retry-After.
//   - Errors use Cloudflare's envelope:
//     {"success":false,"errors":[{"code":…,"message":…}],"messages":[],"result":null}.
//
// The error codes for a missing key (10009), the per-key write limit, too
// large values and too long keys are the fake's best knowledge, not
// verified against the live API; cfkv acts only on the HTTP status and
// Retry-After, never on these codes.
//
// Not emulated: eventual consistency (reads here see writes at once), the
// free plan's daily limits, namespaces other than the one configured, bulk
// get.
package kvfake
