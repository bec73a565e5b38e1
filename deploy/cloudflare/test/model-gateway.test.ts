import { afterEach, describe, expect, it, vi } from 'vitest';

import { MemoryLedger, meteredOutbound } from '../src/model-gateway';
import { costOf, decodeMessage, defaultPrices, lookupPrice, parsePrices, SSEUsageMeter } from '../src/model-meter';

afterEach(() => vi.unstubAllGlobals());

const enc = new TextEncoder();

const STREAM =
  'event: message_start\n' +
  'data: {"type":"message_start","message":{"model":"claude-opus-5-5-20261101","usage":{"input_tokens":12,"cache_creation_input_tokens":300,"cache_read_input_tokens":4000,"cache_creation":{"ephemeral_5m_input_tokens":100,"ephemeral_1h_input_tokens":200},"output_tokens":1}}}\n\n' +
  'event: ping\ndata: {"type": "ping"}\n\n' +
  'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"usage: {\\"output_tokens\\": 999} é"}}\n\n' +
  'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":15}}\n\n' +
  'event: message_delta\ndata: {"type":"message_delta","usage":{"input_tokens":12,"cache_read_input_tokens":4000,"output_tokens":42}}\n\n' +
  'event: message_stop\ndata: {"type":"message_stop"}\n\n';

const STREAM_USAGE = { input_tokens: 12, output_tokens: 42, cache_read_input_tokens: 4000, cache_creation_input_tokens: 300, cache_creation_1h: 200 };

/** A stream of the given chunks, one read each. */
function chunked(chunks: Uint8Array[]): ReadableStream<Uint8Array> {
  let i = 0;
  return new ReadableStream({
    pull(c) {
      if (i < chunks.length) c.enqueue(chunks[i++]!);
      else c.close();
    },
  });
}

function cut(b: Uint8Array, size: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (let i = 0; i < b.length; i += size) out.push(b.slice(i, i + size));
  return out;
}

/** fetch answers with upstream(); every request is kept. */
function upstream(answer: () => Response): { calls: Request[] } {
  const calls: Request[] = [];
  vi.stubGlobal('fetch', vi.fn(async (input: string, init: RequestInit) => {
    calls.push(new Request(input, { ...init, duplex: 'half' } as RequestInit));
    return answer();
  }));
  return { calls };
}

function messages(): Request {
  return new Request('https://api.anthropic.com/v1/messages?beta=true', {
    method: 'POST',
    headers: { 'x-api-key': 'agentfleet-egress-injected', 'content-type': 'application/json' },
    body: '{"model":"claude-opus-5-5","stream":true}',
  });
}

const env = { ANTHROPIC_API_KEY: 'sk-ant-real' };

describe('SSE usage meter', () => {
  it('takes the last value of each field, however the stream is cut', () => {
    const bytes = enc.encode(STREAM);
    for (const s of [bytes, enc.encode(STREAM.replaceAll('\n', '\r\n')), enc.encode(STREAM.replaceAll('\n', '\r'))]) {
      for (const size of [1, 2, 3, 7, 64, 1000, s.length]) {
        const m = new SSEUsageMeter();
        for (const c of cut(s, size)) m.write(c);
        expect(m.usage, `chunks of ${size}`).toEqual(STREAM_USAGE);
        expect(m.model).toBe('claude-opus-5-5-20261101');
      }
    }
  });

  it('skips events it does not read, and survives garbage', () => {
    const m = new SSEUsageMeter();
    m.write(enc.encode(`event: content_block_delta\ndata: ${'x'.repeat(3 << 20)}\n\n`));
    m.write(enc.encode('data: not json\n\n\x00\xff:\nevent\ndata\n\n'));
    m.write(enc.encode('data: {"type":"message_delta","usage":{"output_tokens":3,"input_tokens":-5}}\n\n'));
    m.write(enc.encode('event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n'));
    expect(m.usage.output_tokens).toBe(3);
    expect(m.usage.input_tokens).toBe(0);
    expect(m.errorType).toBe('overloaded_error');
  });

  it('reads the same from random input however it is cut (a seeded fuzz)', () => {
    let seed = 42;
    const rnd = (n: number) => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return seed % n;
    };
    const pieces = [STREAM, '\r', '\n', 'data:', 'event: message_delta\n', '{"type":"message_delta","usage":{"output_tokens":', '7}}', '\u00e9', '\x00', ':', ' '];
    for (let round = 0; round < 300; round++) {
      let text = '';
      for (let k = rnd(20); k > 0; k--) text += rnd(4) === 0 ? STREAM.slice(rnd(STREAM.length)) : pieces[rnd(pieces.length)];
      const bytes = enc.encode(text);
      const whole = new SSEUsageMeter();
      whole.write(bytes);
      const split = new SSEUsageMeter();
      for (let i = 0; i < bytes.length;) {
        const n = 1 + rnd(40);
        split.write(bytes.slice(i, i + n));
        i += n;
      }
      expect(split.usage).toEqual(whole.usage);
      expect(split.model).toBe(whole.model);
      for (const v of Object.values(whole.usage)) expect(v).toBeGreaterThanOrEqual(0);
      expect(decodeMessage(text.slice(rnd(text.length + 1)))?.usage.input_tokens ?? 0).toBeGreaterThanOrEqual(0);
    }
  });

  it('reads a non-streaming message', () => {
    expect(decodeMessage('{"model":"m","usage":{"input_tokens":5,"output_tokens":6}}')?.usage.output_tokens).toBe(6);
    for (const bad of ['', 'null', '[]', '{"usage":null}', '{']) expect(decodeMessage(bad)).toBeUndefined();
  });
});

describe('prices', () => {
  it('match dated ids and fall back to the default model', () => {
    const p = defaultPrices();
    expect(lookupPrice(p, 'claude-sonnet-4-5-20250929').price).toBe(p['claude-sonnet-4-5']);
    expect(lookupPrice(p, 'claude-3-5-haiku@20241022').price).toBe(p['claude-3-5-haiku']);
    expect(lookupPrice(p, 'claude-opus-4-1-20250805').price).toBe(p['claude-opus-4-1']);
    expect(lookupPrice(p, 'Claude-Sonnet-5-5[1m]').price).toBe(p['claude-sonnet-5-5']);
    expect(lookupPrice(p, 'gpt-9')).toEqual({ price: p['claude-opus-5-5'], known: false });
    expect(lookupPrice(p, 'constructor').known).toBe(false);
  });

  it('price as the Go gateway does', () => {
    const p = defaultPrices();
    expect(costOf(p['claude-opus-5-5']!, STREAM_USAGE)).toBeCloseTo((12 * 4 + 42 * 20 + 4000 * 0.2 + 100 * 5 + 200 * 8) / 1e6, 12);
    const big = { input_tokens: 20_000, output_tokens: 1000, cache_read_input_tokens: 90_000, cache_creation_input_tokens: 0, cache_creation_1h: 0 };
    expect(costOf(p['claude-haiku-5-5']!, big)).toBeCloseTo((20_000 * 0.5 + 90_000 * 0.05 + 1000 * 2.5) / 1e6, 12);
  });

  it('take overrides and refuse bad ones', () => {
    const p = parsePrices('{"claude-new-6-0-20270101":{"input":1,"output":2,"cache_read":0.1,"cache_write":1.25}}');
    expect(lookupPrice(p, 'claude-new-6-0-20270315').price).toEqual({ input: 1, output: 2, cache_read: 0.1, cache_write: 1.25 });
    expect(p['claude-haiku-5-5']).toEqual(defaultPrices()['claude-haiku-5-5']);
    for (const bad of ['[1]', 'null', '{"m":{"input":-1}}', '{"m":{"input":"1"}}', '{"":{}}', '{"m":{"long":{"long":{}}}}', '{']) {
      expect(() => parsePrices(bad), bad).toThrow();
    }
  });
});

describe('metered egress', () => {
  it('passes the stream byte for byte with the real key, and records its usage', async () => {
    const bytes = enc.encode(STREAM);
    const { calls } = upstream(() => new Response(chunked(cut(bytes, 5)), { headers: { 'content-type': 'text/event-stream', 'request-id': 'r1' } }));
    const ledger = new MemoryLedger();
    ledger.open('sb1');
    let t = 1000;
    const resp = await meteredOutbound(messages(), env, { containerId: 'sb1' }, { ledger, prices: defaultPrices(), now: () => (t += 10) });
    expect(resp.status).toBe(200);
    expect(resp.headers.get('request-id')).toBe('r1');
    expect(new Uint8Array(await resp.arrayBuffer())).toEqual(bytes);
    expect(calls).toHaveLength(1);
    expect(calls[0]!.headers.get('x-api-key')).toBe('sk-ant-real');
    const run = ledger.runs.get('sb1')!;
    expect(run.events).toHaveLength(1);
    const ev = run.events[0]!;
    expect(ev).toMatchObject({ model: 'claude-opus-5-5-20261101', input_tokens: 12, output_tokens: 42, cache_read_input_tokens: 4000, cache_creation_input_tokens: 300, status: 200, ms: 10 });
    expect(ev.cost_usd).toBeCloseTo(costOf(defaultPrices()['claude-opus-5-5']!, STREAM_USAGE), 12);
    expect(run.spentUSD).toBe(ev.cost_usd);
  });

  it('meters a non-streaming answer', async () => {
    upstream(() => new Response('{"model":"claude-sonnet-5-5","usage":{"input_tokens":40,"output_tokens":7}}', { headers: { 'content-type': 'application/json' } }));
    const ledger = new MemoryLedger();
    ledger.open('sb1');
    const resp = await meteredOutbound(messages(), env, { containerId: 'sb1' }, { ledger, prices: defaultPrices() });
    expect(await resp.text()).toContain('usage');
    expect(ledger.runs.get('sb1')!.events[0]!.cost_usd).toBeCloseTo((40 * 2 + 7 * 10) / 1e6, 12);
  });

  it('forwards the crossing call and refuses the next with 402', async () => {
    const answer = 'data: {"type":"message_start","message":{"model":"claude-sonnet-5-5","usage":{"input_tokens":1000,"output_tokens":100}}}\n\n';
    const { calls } = upstream(() => new Response(answer, { headers: { 'content-type': 'text/event-stream' } }));
    const ledger = new MemoryLedger();
    ledger.open('sb1', 0.005); // $0.003 a call
    const opts = { ledger, prices: defaultPrices() };
    for (let i = 0; i < 2; i++) {
      const r = await meteredOutbound(messages(), env, { containerId: 'sb1' }, opts);
      expect(r.status).toBe(200);
      await r.text();
    }
    const refused = await meteredOutbound(messages(), env, { containerId: 'sb1' }, opts);
    expect(refused.status).toBe(402);
    expect(refused.headers.get('x-should-retry')).toBe('false');
    const body = (await refused.json()) as { type: string; error: { type: string; message: string } };
    expect(body.type).toBe('error');
    expect(body.error.type).toBe('billing_error');
    expect(body.error.message).toContain('max_cost_usd');
    expect(calls).toHaveLength(2);
    expect(ledger.runs.get('sb1')!.spentUSD).toBeCloseTo(0.006, 12);
  });

  it('passes a 429 through unchanged and records it at no cost', async () => {
    upstream(() => new Response('{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}', { status: 429, headers: { 'retry-after': '7' } }));
    const ledger = new MemoryLedger();
    ledger.open('sb1');
    const resp = await meteredOutbound(messages(), env, { containerId: 'sb1' }, { ledger, prices: defaultPrices() });
    expect(resp.status).toBe(429);
    expect(resp.headers.get('retry-after')).toBe('7');
    expect(await resp.text()).toContain('rate_limit_error');
    expect(ledger.runs.get('sb1')!.events).toMatchObject([{ status: 429, cost_usd: 0 }]);
  });

  it('records what a stream the agent dropped had reported', async () => {
    const start = 'data: {"type":"message_start","message":{"model":"claude-sonnet-5-5","usage":{"input_tokens":500,"output_tokens":1}}}\n\n';
    let pulls = 0;
    upstream(() => new Response(new ReadableStream({
      pull(c) {
        if (pulls++ === 0) c.enqueue(enc.encode(start));
      },
    }), { headers: { 'content-type': 'text/event-stream' } }));
    const ledger = new MemoryLedger();
    ledger.open('sb1');
    const resp = await meteredOutbound(messages(), env, { containerId: 'sb1' }, { ledger, prices: defaultPrices() });
    const reader = resp.body!.getReader();
    await reader.read();
    await reader.cancel('agent went');
    expect(ledger.runs.get('sb1')!.events[0]!.input_tokens).toBe(500);
  });

  it('refuses a sandbox with no run, and paths that are not the Messages API, forwarding nothing', async () => {
    const { calls } = upstream(() => new Response('{}'));
    const ledger = new MemoryLedger();
    const none = await meteredOutbound(messages(), env, { containerId: 'nobody' }, { ledger, prices: defaultPrices() });
    expect(none.status).toBe(401);
    ledger.open('sb1');
    for (const path of ['/v1/messages/batches', '/v1/files', '/api/hello']) {
      const r = await meteredOutbound(new Request(`https://api.anthropic.com${path}`, { method: 'POST', body: 'x' }), env, { containerId: 'sb1' }, { ledger, prices: defaultPrices() });
      expect(r.status, path).toBe(404);
    }
    // The model routes in every traversal spelling: none forwarded with the key.
    for (const path of ['/v1/models/../files', '/v1/models/%2e%2e/files', '/v1/models/..%2ffiles', '/v1/models/..%2Ffiles',
      '/v1/models/%252e%252e/files', '/v1/models/..%5cfiles', '/v1/models/..;/files', '/v1/models/', '/v1/models/a%00',
      '/v1/models/Claude', '/v1/models/claude/../../v1/files', '/v1/models/.%2e/files']) {
      const r = await meteredOutbound(new Request(`https://api.anthropic.com${path}`), env, { containerId: 'sb1' }, { ledger, prices: defaultPrices() });
      expect(r.status, path).toBe(404);
    }
    expect(calls).toHaveLength(0);
    const models = await meteredOutbound(new Request('https://api.anthropic.com/v1/models'), env, { containerId: 'sb1' }, { ledger, prices: defaultPrices() });
    expect(models.status).toBe(200);
    expect(calls).toHaveLength(1);
    expect(ledger.runs.get('sb1')!.events).toHaveLength(0);
  });
});
