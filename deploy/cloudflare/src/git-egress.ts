// Git credentials for workspaces (docs/workspaces.md): held by the Worker, added on
// egress, never in the container.
//
// The fleet's worker runs git inside the container through the generic
// POST /proc route (one implementation for every provider, see
// pkg/workspace). For an https remote that needs credentials, git's request
// leaves the container through the egress interception (interceptHttps) and
// reaches `gitOutbound`, which runs in the Worker: for a host listed in the
// GIT_CREDENTIALS secret it drops whatever Authorization the container sent
// and sets Basic auth from the secret, then forwards. The container only
// ever sees the answers, so the token is never in its environment, argv,
// files, .git/config or remote URL. Requests to other hosts are forwarded
// unchanged; api.anthropic.com keeps its own handler.

import { ANTHROPIC_HOST, anthropicOutbound, type EgressEnv } from './egress';

/** Secrets the git egress handler reads. */
export interface GitEgressEnv extends EgressEnv {
  /**
   * Secret: git's credential-store format, one entry per line:
   * https://<user>:<token>@<host>[:<port>][/<path>] (user and token
   * percent-encoded). The entry with the same scheme and host whose path is
   * the longest prefix of the request's path is used.
   */
  GIT_CREDENTIALS?: string;
}

export interface GitCredential {
  protocol: string; // "https:" or "http:"
  host: string; // host[:port], lower case
  path: string; // without a trailing slash; "" matches every path
  username: string;
  password: string;
}

/**
 * Parses credential-store lines. Blank lines and '#' comments are skipped;
 * a malformed line is skipped too (the handler must not fail every request
 * for one bad entry) and never echoed.
 */
export function parseGitCredentials(text: string | undefined): GitCredential[] {
  const out: GitCredential[] = [];
  for (const raw of (text ?? '').split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    let u: URL;
    try {
      u = new URL(line);
    } catch {
      continue;
    }
    if ((u.protocol !== 'https:' && u.protocol !== 'http:') || u.host === '' || u.username === '' || u.password === '') continue;
    let username: string;
    let password: string;
    try {
      username = decodeURIComponent(u.username);
      password = decodeURIComponent(u.password);
    } catch {
      continue;
    }
    out.push({ protocol: u.protocol, host: u.host.toLowerCase(), path: u.pathname.replace(/\/+$/, ''), username, password });
  }
  return out;
}

/** The entry for a request URL: same scheme and host, longest path prefix. */
export function matchGitCredential(creds: GitCredential[], url: URL): GitCredential | undefined {
  let best: GitCredential | undefined;
  for (const c of creds) {
    if (c.protocol !== url.protocol || c.host !== url.host.toLowerCase()) continue;
    if (c.path !== '' && url.pathname !== c.path && !url.pathname.startsWith(c.path + '/')) continue;
    if (best === undefined || c.path.length > best.path.length) best = c;
  }
  return best;
}

function basic(c: GitCredential): string {
  const bytes = new TextEncoder().encode(`${c.username}:${c.password}`);
  let bin = '';
  for (const b of bytes) bin += String.fromCharCode(b);
  return `Basic ${btoa(bin)}`;
}

/**
 * Catch-all outbound handler of the Sandbox class. api.anthropic.com goes
 * to anthropicOutbound; a host with a GIT_CREDENTIALS entry gets the
 * entry's Basic auth (whatever the container sent is dropped, and the
 * server's WWW-Authenticate is not passed back); anything else is forwarded
 * as it is.
 */
export async function gitOutbound(request: Request, env: GitEgressEnv): Promise<Response> {
  const url = new URL(request.url);
  if (url.hostname === ANTHROPIC_HOST) return anthropicOutbound(request, env);
  const cred = matchGitCredential(parseGitCredentials(env.GIT_CREDENTIALS), url);
  if (cred === undefined) return fetch(request);
  const headers = new Headers(request.headers);
  headers.delete('authorization');
  headers.delete('host');
  headers.set('authorization', basic(cred));
  const hasBody = request.method !== 'GET' && request.method !== 'HEAD';
  const resp = await fetch(url.toString(), {
    method: request.method,
    headers,
    body: hasBody ? request.body : null,
    redirect: 'manual',
  });
  if (!resp.headers.has('www-authenticate')) return resp;
  const out = new Headers(resp.headers);
  out.delete('www-authenticate');
  return new Response(resp.body, { status: resp.status, statusText: resp.statusText, headers: out });
}
