// Package trigger starts jobs from signed inbound webhooks.
//
// A tenant's trigger is a name, a Standard Webhooks secret (whsec_…) and a
// job template: a job in JSON whose string values may hold text/template
// placeholders ({{ .field }}) filled from the top-level fields of the
// webhook's body. Triggers are kept in the KV bucket <PREFIX>_TRIGGERS
// (key <tenant>.<name>), which only the dispatcher's role reads.
//
// POST /v1/triggers/<tenant>/<name> with a body signed per Standard
// Webhooks (webhook-id, webhook-timestamp, webhook-signature) submits the
// rendered job. Its id is "<name>-<digest of the webhook-id>", so a replay
// of the same webhook-id starts nothing new: within the jobs stream's
// de-duplication window the submission is a duplicate, and after it the
// existing status record is found first. Placeholders are filled inside
// the template's decoded strings, never by splicing text into JSON, so a
// body's field cannot add or change the job's fields; the result is decoded
// strictly into a job and validated like any submission.
package trigger
