import { afterEach, describe, expect, it, vi } from 'vitest';

vi.mock('@cloudflare/sandbox', async () => (await import('./fake-sdk')).sdkModule);

import { allowedHostsFrom, anthropicOutbound, CREDENTIAL_PLACEHOLDER, placeholderEnv } from '../src/egress';
import { modelOutbound, Sandbox } from '../src/sandbox';
import * as worker from '../src/index';
import { makeEnv } from './helpers';

afterEach(() => vi.unstubAllGlobals());

function captureFetch(): { calls: Request[] } {
  const calls: Request[] = [];
  vi.stubGlobal('fetch', vi.fn(async (input: string, init: RequestInit) => {
    calls.push(new Request(input, { ...init, duplex: 'half' } as RequestInit));
    return new Response('{"ok":true}', { status: 200 });
  }));
  return { calls };
}

describe('egress interception', () => {
  it('swaps the placeholder x-api-key for the real key and forwards to api.anthropic.com', async () => {
    const { calls } = captureFetch();
    const inbound = new Request('https://api.anthropic.com/v1/messages?beta=true', {
      method: 'POST',
      headers: { 'x-api-key': CREDENTIAL_PLACEHOLDER, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
      body: '{"model":"m"}',
    });
    const resp = await anthropicOutbound(inbound, { ANTHROPIC_API_KEY: 'sk-ant-real' });
    expect(resp.status).toBe(200);
    expect(calls).toHaveLength(1);
    const out = calls[0]!;
    expect(out.url).toBe('https://api.anthropic.com/v1/messages?beta=true');
    expect(out.method).toBe('POST');
    expect(out.headers.get('x-api-key')).toBe('sk-ant-real');
    expect(out.headers.get('authorization')).toBeNull();
    expect(out.headers.get('anthropic-version')).toBe('2023-06-01');
    expect(await out.text()).toBe('{"model":"m"}');
  });

  it('overwrites whatever credential the container sent', async () => {
    const { calls } = captureFetch();
    const inbound = new Request('https://api.anthropic.com/v1/models', {
      headers: { 'x-api-key': 'sk-ant-smuggled', authorization: 'Bearer smuggled' },
    });
    await anthropicOutbound(inbound, { ANTHROPIC_API_KEY: 'sk-ant-real' });
    expect(calls[0]!.headers.get('x-api-key')).toBe('sk-ant-real');
    expect(calls[0]!.headers.get('authorization')).toBeNull();
  });

  it('injects an OAuth token as Authorization: Bearer when that is the configured secret', async () => {
    const { calls } = captureFetch();
    const inbound = new Request('https://api.anthropic.com/v1/messages', { method: 'POST', headers: { authorization: `Bearer ${CREDENTIAL_PLACEHOLDER}` }, body: '{}' });
    await anthropicOutbound(inbound, { CLAUDE_CODE_OAUTH_TOKEN: 'oauth-real' });
    expect(calls[0]!.headers.get('authorization')).toBe('Bearer oauth-real');
    expect(calls[0]!.headers.get('x-api-key')).toBeNull();
  });

  it('answers 401 itself and forwards nothing when no credential is configured', async () => {
    const { calls } = captureFetch();
    const resp = await anthropicOutbound(new Request('https://api.anthropic.com/v1/messages', { method: 'POST', body: '{}' }), {});
    expect(resp.status).toBe(401);
    expect(calls).toHaveLength(0);
  });

  it('gives processes a placeholder matching the configured secret, never the secret', () => {
    expect(placeholderEnv({ ANTHROPIC_API_KEY: 'sk-real' })).toEqual({ ANTHROPIC_API_KEY: CREDENTIAL_PLACEHOLDER });
    expect(placeholderEnv({ CLAUDE_CODE_OAUTH_TOKEN: 'o' })).toEqual({ CLAUDE_CODE_OAUTH_TOKEN: CREDENTIAL_PLACEHOLDER });
    expect(placeholderEnv({})).toEqual({});
  });

  it('the Sandbox class locks egress down and routes api.anthropic.com through the handler', () => {
    const sb = new Sandbox({} as DurableObjectState<{}>, makeEnv({ SANDBOX_ALLOWED_HOSTS: ' github.com, registry.npmjs.org ,' }));
    expect(sb.interceptHttps).toBe(true);
    expect(sb.enableInternet).toBe(false);
    expect(sb.allowedHosts).toEqual(['api.anthropic.com', 'github.com', 'registry.npmjs.org']);
    expect(Sandbox.outboundByHost?.['api.anthropic.com']).toBe(modelOutbound);
    expect(allowedHostsFrom(undefined)).toEqual(['api.anthropic.com']);
  });

  it('the Worker module exports the Durable Object class, ContainerProxy and a fetch handler', () => {
    expect(worker.Sandbox).toBe(Sandbox);
    expect(typeof worker.ContainerProxy).toBe('function');
    expect(typeof worker.default.fetch).toBe('function');
  });
});
