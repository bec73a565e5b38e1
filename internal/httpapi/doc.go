// Package httpapi is the fleet's HTTP API (docs/http-api.md): /v1/ on the
// dispatcher's --http server, beside the dashboard.
//
// Every endpoint is a thin layer over what the NATS API already does: submit,
// status, cancel and the session ops go to the dispatcher's <prefix>.api.*
// endpoints (internal/fleetapi); a query's events are replayed from
// FLEET_QUERIES with an ordered consumer and sent as Server-Sent Events; the
// list pages the status index (the status store's keys, status/<tenant>/<id>)
// and reads only the records of the page it returns; a diff is read from
// storage.
//
// # Access
//
// An Authenticator turns a request into a Principal: the operator (every
// tenant) or one tenant. Auth implements it for the operator's --ui-token
// and, through its TenantToken function, for tenant tokens (docs/tenancy.md)
// (tenancy.VerifyToken plugs in there). When neither is configured, loopback
// clients are the operator and everyone else gets 401; when either is, a
// request without a valid bearer token gets 401. /v1/openapi.json needs no
// token.
//
// A tenant principal sees its own queries only: another tenant's id answers
// 404, as a missing one does, and a body or ?tenant= naming another tenant is
// refused (403) without anything being enqueued.
//
// # Errors
//
// Every error is JSON {"error":{"code","message"}} with 400 (malformed JSON,
// unknown fields of the fixed bodies, oversized bodies, a content type other
// than application/json, an invalid job), 401, 403, 404, 409 (a duplicate
// submission, a query that already ended) or 429.
package httpapi
