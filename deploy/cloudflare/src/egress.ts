// Egress interception: how the agent's API credential reaches the Anthropic API
// without ever entering the container.
//
// Pattern from the @cloudflare/sandbox Claude Code example
// (examples/claude-code/src/index.ts, SDK 0.12.x): the Sandbox Durable Object
// class sets `interceptHttps = true`, `enableInternet = false`, an
// `allowedHosts` list, and `Sandbox.outboundByHost['api.anthropic.com']` to a
// handler that runs in the Worker (never in the container). Processes get a
// placeholder credential env var so `claude` sends an auth header at all; the
// handler replaces that header with the real secret from the Worker's env and
// forwards the request to https://api.anthropic.com.
//
// Everything that depends on that interception API lives here and in
// sandbox.ts, so a change of the SDK's egress API touches only these two files.

/** The only host whose requests get a credential injected. */
export const ANTHROPIC_HOST = 'api.anthropic.com';

/**
 * Value given to the agent's credential variable inside the sandbox. It is
 * not a secret: the egress handler discards it and sends the real one.
 */
export const CREDENTIAL_PLACEHOLDER = 'agentfleet-egress-injected';

/** The secrets the egress handler may read (Worker secrets, never container env). */
export interface EgressEnv {
  ANTHROPIC_API_KEY?: string;
  CLAUDE_CODE_OAUTH_TOKEN?: string;
}

/**
 * The placeholder variables every sandboxed process gets, mirroring which
 * secret the Worker holds: ANTHROPIC_API_KEY (sent by claude as x-api-key) or
 * CLAUDE_CODE_OAUTH_TOKEN (sent as Authorization: Bearer). Empty when neither
 * is configured.
 */
export function placeholderEnv(env: EgressEnv): Record<string, string> {
  if (env.ANTHROPIC_API_KEY) return { ANTHROPIC_API_KEY: CREDENTIAL_PLACEHOLDER };
  if (env.CLAUDE_CODE_OAUTH_TOKEN) return { CLAUDE_CODE_OAUTH_TOKEN: CREDENTIAL_PLACEHOLDER };
  return {};
}

/**
 * Hosts the sandbox may reach with internet otherwise disabled: always
 * api.anthropic.com, plus the comma-separated SANDBOX_ALLOWED_HOSTS var.
 */
export function allowedHostsFrom(extra: string | undefined): string[] {
  const hosts = new Set<string>([ANTHROPIC_HOST]);
  for (const h of (extra ?? '').split(',')) {
    const t = h.trim().toLowerCase();
    if (t !== '') hosts.add(t);
  }
  return [...hosts];
}

/**
 * Outbound handler for api.anthropic.com. Whatever credential headers the
 * container sent are dropped; the Worker's secret is set instead (x-api-key for
 * an API key, Authorization: Bearer for an OAuth token) and the request is
 * forwarded over HTTPS. Without a configured secret it answers 401 itself and
 * forwards nothing.
 */
export async function anthropicOutbound(request: Request, env: EgressEnv): Promise<Response> {
  const url = new URL(request.url);
  const headers = new Headers(request.headers);
  headers.delete('x-api-key');
  headers.delete('authorization');
  headers.delete('host');
  if (env.ANTHROPIC_API_KEY) {
    headers.set('x-api-key', env.ANTHROPIC_API_KEY);
  } else if (env.CLAUDE_CODE_OAUTH_TOKEN) {
    headers.set('authorization', `Bearer ${env.CLAUDE_CODE_OAUTH_TOKEN}`);
  } else {
    return new Response(
      JSON.stringify({
        type: 'error',
        error: { type: 'authentication_error', message: 'agentfleet bridge: no ANTHROPIC_API_KEY or CLAUDE_CODE_OAUTH_TOKEN secret is configured on the Worker' },
      }),
      { status: 401, headers: { 'Content-Type': 'application/json' } },
    );
  }
  const hasBody = request.method !== 'GET' && request.method !== 'HEAD';
  return fetch(`https://${ANTHROPIC_HOST}${url.pathname}${url.search}`, {
    method: request.method,
    headers,
    body: hasBody ? request.body : null,
    redirect: 'manual',
  });
}
