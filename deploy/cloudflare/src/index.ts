// agentfleet sandbox bridge: a Cloudflare Worker that exposes
// @cloudflare/sandbox to the Go worker over HTTP + SSE (deploy/cloudflare/README.md).
//
// Module layout:
//   bridge.ts   routing and route handlers
//   stream.ts   process output as SSE with per-fd byte offsets (resume, pings, kill on disconnect)
//   sse.ts      SSE reading (the SDK's log stream) and writing
//   auth.ts     constant-time bearer auth
//   validate.ts ids, workspace paths, env (secret filtering), durations, offsets
//   shell.ts    argv -> single-quoted POSIX command line
//   egress.ts   API-key injection into requests to api.anthropic.com
//   sandbox.ts  the Sandbox Durable Object class (egress locked down, model RPC methods)
//   model-*.ts  the metered model egress: meter and prices, the run ledger, the /model routes
//   errors.ts   {error, code} responses and SDK error mapping

import { createBridge } from './bridge';

export { Sandbox } from './sandbox';
// Needed by the SDK's egress interception: the Sandbox DO creates outbound
// fetchers that reference this entrypoint (see the SDK's Claude Code example).
export { ContainerProxy } from '@cloudflare/sandbox';
export type { Env } from './env';

export default createBridge();
