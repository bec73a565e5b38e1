import { afterEach, describe, expect, it, vi } from 'vitest';

vi.mock('@cloudflare/sandbox', async () => (await import('./fake-sdk')).sdkModule);

import { gitOutbound, matchGitCredential, parseGitCredentials } from '../src/git-egress';
import { Sandbox } from '../src/sandbox';

afterEach(() => vi.unstubAllGlobals());

function captureFetch(status = 200, headers: Record<string, string> = {}): { calls: Request[] } {
  const calls: Request[] = [];
  vi.stubGlobal('fetch', vi.fn(async (input: string | Request, init?: RequestInit) => {
    calls.push(typeof input === 'string' ? new Request(input, { ...init, duplex: 'half' } as RequestInit) : input);
    return new Response('pack', { status, headers });
  }));
  return { calls };
}

const CREDS = [
  '# the fleet bot',
  'https://fleet-bot:t%40ken-1@git.example.com',
  'https://team-bot:team-token@git.example.com/team',
  'not a url with a s3cret',
  'http://u:p@127.0.0.1:8080',
].join('\n');

describe('git credentials on egress', () => {
  it('parses credential-store lines, skipping malformed ones', () => {
    const c = parseGitCredentials(CREDS);
    expect(c.map((e) => `${e.protocol}//${e.host}${e.path} ${e.username}`)).toEqual([
      'https://git.example.com fleet-bot',
      'https://git.example.com/team team-bot',
      'http://127.0.0.1:8080 u',
    ]);
    expect(c[0]!.password).toBe('t@ken-1');
    expect(parseGitCredentials(undefined)).toEqual([]);
  });

  it('matches scheme and host, longest path prefix first', () => {
    const c = parseGitCredentials(CREDS);
    expect(matchGitCredential(c, new URL('https://git.example.com/team/app.git/info/refs'))?.username).toBe('team-bot');
    expect(matchGitCredential(c, new URL('https://git.example.com/teamx/app.git'))?.username).toBe('fleet-bot');
    expect(matchGitCredential(c, new URL('http://git.example.com/team/app.git'))).toBeUndefined();
    expect(matchGitCredential(c, new URL('https://git.example.com.evil/app.git'))).toBeUndefined();
  });

  it('replaces whatever the container sent with the Worker-held Basic auth and hides the challenge', async () => {
    const { calls } = captureFetch(401, { 'www-authenticate': 'Basic realm="git"' });
    const inbound = new Request('https://git.example.com/acme/app.git/git-upload-pack', {
      method: 'POST',
      headers: { authorization: 'Basic c211Z2dsZWQ=', 'content-type': 'application/x-git-upload-pack-request' },
      body: '0032want',
    });
    const resp = await gitOutbound(inbound, { GIT_CREDENTIALS: CREDS });
    expect(calls).toHaveLength(1);
    const out = calls[0]!;
    expect(out.url).toBe('https://git.example.com/acme/app.git/git-upload-pack');
    expect(out.headers.get('authorization')).toBe(`Basic ${btoa('fleet-bot:t@ken-1')}`);
    expect(out.headers.get('content-type')).toBe('application/x-git-upload-pack-request');
    expect(await out.text()).toBe('0032want');
    expect(resp.status).toBe(401);
    expect(resp.headers.get('www-authenticate')).toBeNull();
  });

  it('forwards other hosts unchanged and keeps api.anthropic.com on its own handler', async () => {
    const { calls } = captureFetch();
    const other = new Request('https://registry.npmjs.org/x', { headers: { authorization: 'Bearer theirs' } });
    await gitOutbound(other, { GIT_CREDENTIALS: CREDS });
    expect(calls[0]).toBe(other);
    await gitOutbound(new Request('https://api.anthropic.com/v1/messages', { method: 'POST', body: '{}' }), { ANTHROPIC_API_KEY: 'sk-real', GIT_CREDENTIALS: CREDS });
    expect(calls[1]!.headers.get('x-api-key')).toBe('sk-real');
    expect(calls[1]!.headers.get('authorization')).toBeNull();
  });

  it('is the Sandbox class catch-all outbound handler', () => {
    expect((Sandbox as unknown as { outbound: unknown }).outbound).toBe(gitOutbound);
  });
});
