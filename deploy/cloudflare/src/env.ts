// Bindings, vars and secrets of the bridge Worker (see wrangler.jsonc).

import type { Sandbox } from './sandbox';

export interface Env {
  /** Durable Object namespace of the Sandbox class (one object + container per sandbox id). */
  Sandbox: DurableObjectNamespace<Sandbox>;
  /** Secret: the bearer token clients must present. Unset or empty = refuse to serve. */
  BRIDGE_TOKEN?: string;
  /** Secret: Anthropic API key, injected by the egress handler only. */
  ANTHROPIC_API_KEY?: string;
  /** Secret (alternative to the API key): Claude Code OAuth token, injected the same way. */
  CLAUDE_CODE_OAUTH_TOKEN?: string;
  /** Secret: git credentials (credential-store lines) added on egress for workspace fetch and push. */
  GIT_CREDENTIALS?: string;
  /** Var: SDK transport to the container, "rpc" (default), "http" or "websocket". */
  SANDBOX_TRANSPORT?: string;
  /** Var: extra comma-separated hosts the sandbox may reach (api.anthropic.com always). */
  SANDBOX_ALLOWED_HOSTS?: string;
  /** Var: model price overrides, JSON as the Go worker's --model-prices file (model-meter.ts). */
  MODEL_PRICES?: string;
  /** Var: default sleep_after when a PUT does not give one ("10m"). */
  SANDBOX_SLEEP_AFTER?: string;
}
