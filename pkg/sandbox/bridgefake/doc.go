// Package bridgefake is an in-process fake of the Cloudflare bridge Worker
// (deploy/cloudflare), serving the HTTP protocol of deploy/cloudflare/README.md over
// httptest so that Go tests can run sandbox.Cloudflare end to end without
// Cloudflare, Node or Docker.
//
// # What it implements
//
//	PUT    /v1/sb/:id                           create or wake: {sleep_after?, env?} → {id, ready:true}
//	POST   /v1/sb/:id/proc                      {proc_id, argv[], cwd?, env?, timeout_ms?, stdin_path?} → {proc_id, pid}
//	GET    /v1/sb/:id/proc/:proc_id/stream      SSE: out {fd,off,b64}, exit {code,status}, error {code,message}, ": ping"
//	POST   /v1/sb/:id/proc/:proc_id/kill        {signal?} → {killed}
//	GET    /v1/sb/:id/proc/:proc_id             {status, exit_code?}
//	PUT    /v1/sb/:id/file?path=                raw bytes → 204
//	GET    /v1/sb/:id/file?path=                raw bytes
//	DELETE /v1/sb/:id                           204, idempotent
//	PUT    /v1/sb/:id/model                     open a model run: {tenant, query_id, attempt, first_call, max_cost_usd?, spent_usd?} → {open:true}
//	GET    /v1/sb/:id/model?from=N              {events, next, spent_usd, max_cost_usd?, capped}; 404 model_run_not_found
//	DELETE /v1/sb/:id/model?from=N              the same, then the run is closed
//	GET    /v1/version                          {version, capabilities[]}: what the bridge supports
//	GET    /healthz                             unauthenticated
//
// With Options.Legacy the fake plays the previous release's bridge: no
// /v1/version and no /model routes (404).
//
// Every /v1 route requires "Authorization: Bearer <token>", compared in
// constant time (401 otherwise). Errors are JSON {"error": message, "code":
// code}: 400 for a bad body, ID or path, 404 for an unknown sandbox, process
// or file, 409 when a proc_id is reused with a different request, 413 for a
// file over 32 MiB, 503 when creation fails (injected).
//
// # How it runs processes
//
// Each sandbox is a directory (workspace/, home/, tmp/) under the fake's
// temp dir. Processes are started with os/exec, argv exec'd directly (never
// through a shell; argv[0] is looked up in the sandbox's PATH, not the test
// process's), in their own process group, with cwd and stdin_path confined
// to the workspace. Their environment is built like a fresh container's: a
// minimal base (PATH, HOME and TMPDIR inside the sandbox dir, LANG) plus
// Options.BaseEnv, the sandbox's env and the request's env; never the test
// process's environment. stdout and stderr are kept whole in memory with
// per-fd byte offsets, so any stream can resume with from=<off1>,<off2>.
// Reading a process's pipe pauses while more than Options.OutputWindow
// bytes are unsent to any stream, so an unread stream stalls the process as
// a full pipe would. A start with a known proc_id and the same request
// returns the existing process (idempotent). Exit statuses: "completed"
// (code 0), "failed" (code != 0), "killed" (terminated by a signal; code
// 128+signal number, as a shell reports it). GET /proc reports the exit as
// soon as the process is reaped; a stream sends its exit event only after
// all output. A kill signals the whole process group; when the leader exits,
// what is left of its group is killed, and output held open by a process
// outside it is cut off after 2 s.
//
// # Model calls
//
// With Options.ModelUpstream the fake plays the Worker's metered egress for
// api.anthropic.com (deploy/cloudflare/src/model-gateway.ts): every process
// gets ANTHROPIC_BASE_URL (a loopback egress naming its sandbox) and a
// placeholder ANTHROPIC_API_KEY; the egress answers 401 for a sandbox with
// no open run, else forwards to an pkg/gateway.Gateway holding
// Options.ModelAPIKey, which meters with the Go gateway's rules and answers
// 402 past the run's cap. The calls it records are what GET /model reports.
//
// # Fault injection and counters
//
// FailCreate / FailCreateStatus / DelayCreate make creation fail or slow;
// DropStreamAfter cuts stream connections after a number of output bytes
// (cleanly, or by aborting the connection with SetDropAbort); SetExitMode
// makes streams end without their exit event, hang without one, or send an
// error event; SetPings stops the ": ping" comments; FailModel makes the /model routes answer 503. Counters (Creates,
// Starts, Launches, StreamConnects, Kills, Deletes, Unauthorized) and
// ProcEnv let tests assert what the client did.
//
// New registers Close with the test's Cleanup: it kills every process group,
// ends open streams and waits for every goroutine of the fake.
package bridgefake
