// Package webhook delivers a tenant's status events to its HTTP endpoints
// (docs/webhooks.md), signed as Standard Webhooks.
//
// # Endpoints
//
// Endpoints live in the KV bucket <PREFIX>_WEBHOOKS, one per key
// <tenant>.<endpoint id>, each with its URL, the events it wants (succeeded,
// failed, cancelled, idle, awaiting_approval) and its signing secret
// (whsec_…). They are added, listed and removed through the dispatcher's
// <prefix>.api.webhook.{add,ls,rm,deliveries} endpoints, which this package
// serves inside `dispatcher serve` (so --webhook-allow-private is the
// server's to decide): a URL that is not http(s), or whose host is or
// resolves to a loopback, private, link-local or unspecified address, is
// refused unless the server allows private receivers. Connections are
// checked again when they are made, so a name that later resolves to such an
// address is refused too.
//
// # Deliveries
//
// A durable consumer ("webhooks") on FLEET_QUERIES's status subjects reads
// every status event, apart from the dispatcher's own consumers, so
// deliveries never slow status processing. For each event that matches an
// endpoint added before it, a delivery record is written to the KV bucket
// <PREFIX>_WEBHOOK_DELIVERIES before the event is acked, so a crash loses no
// delivery (at least once). Its webhook-id is derived from the endpoint and
// the event's stream sequence: a redelivered event makes no second record,
// and every retry of a delivery carries the same webhook-id.
//
// Each endpoint has a bounded number of requests in flight (Config.InFlight);
// the rest wait in its queue, or, past the queue's size, in the bucket for
// the sweeper. A failed attempt (no 2xx within Config.Timeout, a connection
// refused, a redirect) is retried after Config.Backoff, doubling up to an
// hour, until 24 hours after the event; every attempt is recorded (`dispatcher
// tenant webhook deliveries`). The sweeper picks up deliveries that are due
// and not in hand (after a restart, or a full queue).
//
// The body is {"type":"query.<state>","timestamp":<the event's time>,
// "data":<the status event>}, with headers webhook-id, webhook-timestamp and
// webhook-signature (v1,<base64 HMAC-SHA256 of id.timestamp.body>), made
// with github.com/standard-webhooks/standard-webhooks/libraries.
package webhook
