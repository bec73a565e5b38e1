// The Sandbox Durable Object class bound as `Sandbox` in wrangler.jsonc.
//
// It is the SDK's Sandbox with egress locked down (see egress.ts): internet off
// except the allowed hosts, HTTPS interception on so the outbound handler can
// see and rewrite requests to api.anthropic.com.

import { Sandbox as BaseSandbox } from '@cloudflare/sandbox';
import { allowedHostsFrom, anthropicOutbound, ANTHROPIC_HOST } from './egress';
import { gitOutbound } from './git-egress';
import type { Env } from './env';

export class Sandbox extends BaseSandbox<Env> {
  override interceptHttps = true;
  override enableInternet = false;

  constructor(ctx: DurableObjectState<{}>, env: Env) {
    super(ctx, env);
    this.allowedHosts = allowedHostsFrom(env.SANDBOX_ALLOWED_HOSTS);
  }
}

Sandbox.outboundByHost = {
  [ANTHROPIC_HOST]: anthropicOutbound,
};

// Every other intercepted request: git credentials from the GIT_CREDENTIALS
// secret for the hosts it lists, everything else unchanged (git-egress.ts).
Sandbox.outbound = gitOutbound;
