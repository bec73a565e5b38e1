// Package github starts jobs from a GitHub App's webhooks and reports
// their progress back on the issue or pull request.
//
// A rule per repository (kept in the KV bucket <PREFIX>_GITHUB, key the
// lowercased "owner/name") names the tenant whose jobs the repository's
// events start and which events do: a comment that mentions @handle, an
// issue labeled with the rule's label, an issue assigned to the app. The
// Handler serves POST /v1/github: it checks X-Hub-Signature-256 against
// the App's webhook secret, maps the event through the rule (Map), mints
// an installation token scoped to that one repository and submits a
// workspace job on the repository's clone URL whose id derives from the
// delivery id (X-GitHub-Delivery), so a redelivery starts nothing new.
// The token rides on the job (workspace.token), which the worker hands to
// git for that job's fetch and push only.
//
// The Reporter follows the statuses of the jobs GitHub started and posts
// back: a comment with a link to the run when it starts, a comment with
// the outcome when it ends, and a draft pull request for a pushed branch.
package github
