// The model run end to end through the bridge: the Go worker's routes
// (PUT/GET/DELETE /v1/sb/:id/model) and the container's calls to
// api.anthropic.com through the Sandbox class's egress handler.

import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

vi.mock('@cloudflare/sandbox', async () => (await import('./fake-sdk')).sdkModule);

import { CREDENTIAL_PLACEHOLDER } from '../src/egress';
import type { Env } from '../src/env';
import { modelOutbound, Sandbox } from '../src/sandbox';
import { fakeFor, memoryStorage, resetFakes } from './fake-sdk';
import { bridge, call, json, makeEnv, req } from './helpers';

beforeEach(() => resetFakes());
afterEach(() => vi.unstubAllGlobals());

const b = bridge();
const SECRET = 'sk-ant-bridge-secret-0123456789';

/** An env whose Sandbox namespace finds the fake object by its id (the DO id is the sandbox id here). */
function envWith(over: Partial<Env> = {}): Env {
  const ns = { idFromString: (s: string) => s, get: (id: string) => fakeFor(id) };
  return makeEnv({ ANTHROPIC_API_KEY: SECRET, Sandbox: ns as unknown as Env['Sandbox'], ...over });
}

const enc = new TextEncoder();

/** A streamed answer whose usage is 1000 input and 500 output tokens of claude-sonnet-4-5 ($0.003 + $0.0075). */
const SSE =
  'event: message_start\ndata: {"type":"message_start","message":{"model":"claude-sonnet-4-5-20250929","usage":{"input_tokens":1000,"output_tokens":1}}}\n\n' +
  'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}\n\n' +
  'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":500}}\n\n' +
  'event: message_stop\ndata: {"type":"message_stop"}\n\n';
const SSE_COST = (1000 * 3 + 500 * 15) / 1e6;

/** fetch (the egress's upstream) answers SSE in small chunks; every request is kept. */
function upstream(): { calls: Request[] } {
  const calls: Request[] = [];
  vi.stubGlobal('fetch', vi.fn(async (input: string, init: RequestInit) => {
    calls.push(new Request(input, { ...init, duplex: 'half' } as RequestInit));
    const bytes = enc.encode(SSE);
    let i = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        if (i < bytes.length) c.enqueue(bytes.slice(i, (i += 7)));
        else c.close();
      },
    });
    return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' } });
  }));
  return { calls };
}

/** A call from the container: claude sends the placeholder credential. */
function containerCall(sandbox: string, env: Env, path = '/v1/messages?beta=true'): Promise<Response> {
  const r = new Request(`https://api.anthropic.com${path}`, {
    method: 'POST',
    headers: { 'x-api-key': CREDENTIAL_PLACEHOLDER, 'content-type': 'application/json' },
    body: '{"model":"claude-sonnet-4-5","stream":true}',
  });
  return modelOutbound(r, env, { containerId: sandbox });
}

const OPEN = { tenant: 'acme', query_id: 'q1', attempt: 2, first_call: 4 };

describe('model runs', () => {
  it('a sandbox with no open run gets 401 and nothing is forwarded', async () => {
    const { calls } = upstream();
    const env = envWith();
    const resp = await containerCall('sb1', env);
    expect(resp.status).toBe(401);
    expect(((await resp.json()) as { error: { type: string } }).error.type).toBe('authentication_error');
    expect(calls).toHaveLength(0);
    const got = await call(b, req('GET', '/v1/sb/sb1/model'), env);
    expect(got.status).toBe(404);
    expect((await json(got)).code).toBe('model_run_not_found');
  });

  it('meters a streamed answer, adds the credential at egress only, and numbers the calls for .model', async () => {
    const { calls } = upstream();
    const env = envWith();
    const open = await call(b, req('PUT', '/v1/sb/sb1/model', { body: { ...OPEN, max_cost_usd: 5, spent_usd: 0.25 } }), env);
    expect(open.status).toBe(200);
    const openBody = await open.text();
    expect(openBody).toBe('{"open":true}');

    const resp = await containerCall('sb1', env);
    expect(resp.status).toBe(200);
    const text = await resp.text();
    expect(text).toBe(SSE); // byte for byte
    expect(text).not.toContain(SECRET);
    expect([...resp.headers.values()].join(' ')).not.toContain(SECRET);
    // Upstream: the Worker's secret, never the placeholder.
    expect(calls).toHaveLength(1);
    expect(calls[0]!.url).toBe('https://api.anthropic.com/v1/messages?beta=true');
    expect(calls[0]!.headers.get('x-api-key')).toBe(SECRET);

    const rep = await json(await call(b, req('GET', '/v1/sb/sb1/model?from=0'), env));
    expect(rep.events).toEqual([{
      call: 4, attempt: 2, model: 'claude-sonnet-4-5-20250929', input_tokens: 1000, output_tokens: 500,
      cache_read_input_tokens: 0, cache_creation_input_tokens: 0, cost_usd: SSE_COST, status: 200, ms: expect.any(Number),
    }]);
    expect(rep.next).toBe(1);
    expect(rep.spent_usd).toBeCloseTo(0.25 + SSE_COST, 12);
    expect(rep.max_cost_usd).toBe(5);
    expect(rep.capped).toBe(false);
    // No route answer carries the secret.
    expect(JSON.stringify(rep)).not.toContain(SECRET);

    await containerCall('sb1', env).then((r) => r.text());
    const rep2 = await json(await call(b, req('GET', '/v1/sb/sb1/model?from=1'), env));
    expect((rep2.events as { call: number }[]).map((e) => e.call)).toEqual([5]);
    expect(rep2.next).toBe(2);
  });

  it('refuses with 402 past the cap, reports capped, and closes: later calls get 401', async () => {
    const { calls } = upstream();
    const env = envWith();
    await call(b, req('PUT', '/v1/sb/sb2/model', { body: { ...OPEN, max_cost_usd: 0.01 } }), env);
    const crossing = await containerCall('sb2', env); // $0.0105: crosses the cap, it was the last forwarded
    expect(crossing.status).toBe(200);
    await crossing.text(); // metered once the answer has passed
    const rep = await json(await call(b, req('GET', '/v1/sb/sb2/model'), env));
    expect(rep.capped).toBe(true);
    const refused = await containerCall('sb2', env);
    expect(refused.status).toBe(402);
    expect(refused.headers.get('x-should-retry')).toBe('false');
    expect(((await refused.json()) as { error: { type: string } }).error.type).toBe('billing_error');
    expect(calls).toHaveLength(1);

    const closed = await call(b, req('DELETE', '/v1/sb/sb2/model?from=0'), env);
    expect(closed.status).toBe(200);
    const last = await json(closed);
    expect((last.events as unknown[]).length).toBe(1); // the refused call is no call
    expect(last.capped).toBe(true);
    expect((await containerCall('sb2', env)).status).toBe(401);
    expect(calls).toHaveLength(1);
    expect((await call(b, req('DELETE', '/v1/sb/sb2/model'), env)).status).toBe(404);
  });

  it('keeps runs apart per sandbox', async () => {
    upstream();
    const env = envWith();
    await call(b, req('PUT', '/v1/sb/a/model', { body: OPEN }), env);
    expect((await containerCall('b', env)).status).toBe(401);
    expect((await containerCall('a', env)).status).toBe(200);
  });

  it('forwards only the Messages API', async () => {
    const { calls } = upstream();
    const env = envWith();
    await call(b, req('PUT', '/v1/sb/sb1/model', { body: OPEN }), env);
    expect((await containerCall('sb1', env, '/v1/files')).status).toBe(404);
    expect(calls).toHaveLength(0);
  });

  it('rejects a bad open body and a bad cursor with 400, and other methods with 405', async () => {
    const env = envWith();
    for (const body of [
      {}, { ...OPEN, tenant: '' }, { ...OPEN, attempt: -1 }, { ...OPEN, first_call: 0 }, { ...OPEN, first_call: 1.5 },
      { ...OPEN, max_cost_usd: 0 }, { ...OPEN, max_cost_usd: -1 }, { ...OPEN, max_cost_usd: 1e10 }, { ...OPEN, max_cost_usd: '1' },
      { ...OPEN, spent_usd: -0.1 }, { ...OPEN, query_id: 'a\nb' },
    ]) {
      const resp = await call(b, req('PUT', '/v1/sb/sb1/model', { body }), env);
      expect(resp.status, JSON.stringify(body)).toBe(400);
      expect((await json(resp)).code).toBe('invalid_model_run');
    }
    expect(fakeFor('sb1').modelOpen).not.toHaveBeenCalled();
    await call(b, req('PUT', '/v1/sb/sb1/model', { body: OPEN }), env);
    for (const from of ['-1', 'x', '1.5', '99999999999']) {
      const resp = await call(b, req('GET', `/v1/sb/sb1/model?from=${from}`), env);
      expect(resp.status, from).toBe(400);
    }
    expect((await call(b, req('POST', '/v1/sb/sb1/model'), env)).status).toBe(405);
    expect((await call(b, req('GET', '/v1/sb/sb1/model', { token: 'wrong' }), env)).status).toBe(401);
  });

  it('the Sandbox class keeps the run in its own storage (its RPC methods)', async () => {
    const storage = memoryStorage();
    const sb = new Sandbox({ storage } as unknown as DurableObjectState<{}>, envWith());
    expect(await sb.modelState()).toBeUndefined();
    await sb.modelOpen(1, 0.5, OPEN);
    expect(await sb.modelState()).toEqual({ spentUSD: 0.5, maxCostUSD: 1 });
    await sb.modelRecord({ model: 'm', input_tokens: 1, output_tokens: 1, cache_read_input_tokens: 0, cache_creation_input_tokens: 0, cost_usd: 0.6, status: 200, ms: 1 });
    const rep = await sb.modelReport(0);
    expect(rep).toMatchObject({ next: 1, capped: true, max_cost_usd: 1 });
    expect(rep!.events[0]).toMatchObject({ call: 4, attempt: 2, cost_usd: 0.6 });
    expect(await sb.modelClose(0)).toMatchObject({ next: 1 });
    expect(await sb.modelState()).toBeUndefined();
    expect(storage.map.size).toBe(0);
  });
});
