// Model metering for the bridge's egress (docs/gateway.md): the same rules as the Go
// gateway (pkg/gateway, meter.go and prices.go), so a Cloudflare run is
// metered and priced exactly as a local one.
//
// Usage is read from a Messages API event stream as it passes: only the data
// of message_start, message_delta and error events is kept (a
// content_block_delta is skipped, never buffered); per field, the last
// message_delta's cumulative value wins over message_start's.

/** One call's token counts. */
export interface Usage {
  input_tokens: number;
  output_tokens: number;
  cache_read_input_tokens: number;
  cache_creation_input_tokens: number;
  /** The part of cache_creation_input_tokens written with a one-hour lifetime. */
  cache_creation_1h: number;
}

export function emptyUsage(): Usage {
  return { input_tokens: 0, output_tokens: 0, cache_read_input_tokens: 0, cache_creation_input_tokens: 0, cache_creation_1h: 0 };
}

const COUNT_FIELDS = ['input_tokens', 'output_tokens', 'cache_read_input_tokens', 'cache_creation_input_tokens'] as const;

function count(v: unknown): number | undefined {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : undefined;
}

/** Takes every count a usage object has (the last value reported wins, never a sum). */
export function applyUsage(u: Usage, w: unknown): void {
  if (w === null || typeof w !== 'object') return;
  const o = w as Record<string, unknown>;
  for (const f of COUNT_FIELDS) {
    const v = count(o[f]);
    if (v !== undefined) u[f] = v;
  }
  const cc = o['cache_creation'];
  if (cc !== null && typeof cc === 'object') {
    const v = count((cc as Record<string, unknown>)['ephemeral_1h_input_tokens']);
    if (v !== undefined) u.cache_creation_1h = v;
  }
}

/** Largest data of one event the meter keeps; larger events are skipped. */
export const MAX_EVENT_BYTES = 1 << 20;

const WANTED = new Set(['', 'message_start', 'message_delta', 'error']);

/** Reads usage out of an SSE byte stream fed in chunks of any size. */
export class SSEUsageMeter {
  readonly usage: Usage = emptyUsage();
  model = '';
  errorType = '';
  private readonly decoder = new TextDecoder();
  private line = '';
  private keep = true;
  private skipLF = false;
  private event = '';
  private data = '';
  private over = false;

  write(chunk: Uint8Array): void {
    this.text(this.decoder.decode(chunk, { stream: true }));
  }

  private text(s: string): void {
    let i = 0;
    while (i < s.length) {
      if (this.skipLF) {
        this.skipLF = false;
        if (s[i] === '\n') {
          i++;
          continue;
        }
      }
      let j = i;
      while (j < s.length && s[j] !== '\n' && s[j] !== '\r') j++;
      this.take(s.slice(i, j));
      if (j === s.length) return;
      this.skipLF = s[j] === '\r';
      this.endLine();
      i = j + 1;
    }
  }

  private take(part: string): void {
    if (!this.keep) return;
    this.line += part;
    if (this.line.length > MAX_EVENT_BYTES) {
      this.keep = false;
      this.line = '';
      this.over = true;
      return;
    }
    const l = this.line;
    const isField = (f: string) => (l.length >= f.length ? l.startsWith(f) : f.startsWith(l));
    if (isField('event:')) return;
    if (isField('data:')) {
      if (!WANTED.has(this.event)) this.keep = false;
      return;
    }
    this.keep = false;
  }

  private endLine(): void {
    const { line, keep } = this;
    this.line = '';
    this.keep = true;
    if (!keep) return;
    if (line === '') {
      this.dispatch();
    } else if (line.startsWith('event:')) {
      this.event = trim1(line.slice(6));
    } else if (line.startsWith('data:')) {
      this.data = this.data === '' ? trim1(line.slice(5)) : `${this.data}\n${trim1(line.slice(5))}`;
      if (this.data.length > MAX_EVENT_BYTES) {
        this.data = '';
        this.over = true;
      }
    }
  }

  private dispatch(): void {
    const { event, data, over } = this;
    this.event = '';
    this.data = '';
    this.over = false;
    if (over || data === '' || !WANTED.has(event)) return;
    let ev: Record<string, unknown>;
    try {
      const v: unknown = JSON.parse(data);
      if (v === null || typeof v !== 'object') return;
      ev = v as Record<string, unknown>;
    } catch {
      return;
    }
    const msg = ev['message'] as Record<string, unknown> | undefined;
    switch (ev['type']) {
      case 'message_start':
        if (msg !== null && typeof msg === 'object') {
          if (typeof msg['model'] === 'string') this.model = msg['model'];
          applyUsage(this.usage, msg['usage']);
        }
        break;
      case 'message_delta':
        applyUsage(this.usage, ev['usage']);
        break;
      case 'error': {
        const e = ev['error'] as Record<string, unknown> | undefined;
        if (e !== null && typeof e === 'object' && typeof e['type'] === 'string') this.errorType = e['type'];
        break;
      }
    }
  }
}

function trim1(s: string): string {
  return s.startsWith(' ') ? s.slice(1) : s;
}

/** The model and usage of a non-streaming Messages API answer, or undefined. */
export function decodeMessage(text: string): { model: string; usage: Usage } | undefined {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (v === null || typeof v !== 'object') return undefined;
  const o = v as Record<string, unknown>;
  if (o['usage'] === null || typeof o['usage'] !== 'object') return undefined;
  const usage = emptyUsage();
  applyUsage(usage, o['usage']);
  return { model: typeof o['model'] === 'string' ? o['model'] : '', usage };
}

/** Dollars per million tokens of each kind. */
export interface Price {
  input: number;
  output: number;
  cache_read: number;
  cache_write: number;
  cache_write_1h?: number;
  long_above?: number;
  long?: Price;
}

/** Priced when a model is unknown, as Claude Code does: a cap overestimates rather than lets it run free. */
export const FALLBACK_MODEL = 'claude-opus-5-5';

/**
 * The built-in table, the Go gateway's (pkg/gateway/prices.go
 * DefaultPrices; read 2026-11-26 from Anthropic's model pages and the rates
 * Claude Code 2.1.330 applies for the 5.5 models, Anthropic's published list
 * prices for 4.x and 3.x). Keep the two in step.
 */
export function defaultPrices(): Record<string, Price> {
  const sonnet: Price = { input: 3, output: 15, cache_read: 0.3, cache_write: 3.75, cache_write_1h: 6 };
  const opus4: Price = { input: 15, output: 75, cache_read: 1.5, cache_write: 18.75, cache_write_1h: 30 };
  return {
    'claude-opus-5-5': { input: 4, output: 20, cache_read: 0.2, cache_write: 5, cache_write_1h: 8 },
    'claude-sonnet-5-5': { input: 2, output: 10, cache_read: 0.1, cache_write: 2.5, cache_write_1h: 4 },
    'claude-haiku-5-5': {
      input: 0.1, output: 0.5, cache_read: 0.01, cache_write: 0.125, cache_write_1h: 0.2,
      long_above: 100_000, long: { input: 0.5, output: 2.5, cache_read: 0.05, cache_write: 0.625, cache_write_1h: 1 },
    },
    'claude-fable-5-2': { input: 8, output: 40, cache_read: 0.2, cache_write: 10, cache_write_1h: 16 },
    'claude-opus-4-5': { input: 5, output: 25, cache_read: 0.5, cache_write: 6.25, cache_write_1h: 10 },
    'claude-opus-4-1': opus4,
    'claude-opus-4': opus4,
    'claude-sonnet-4-5': sonnet,
    'claude-sonnet-4': sonnet,
    'claude-3-7-sonnet': sonnet,
    'claude-3-5-sonnet': sonnet,
    'claude-haiku-4-5': { input: 1, output: 5, cache_read: 0.1, cache_write: 1.25, cache_write_1h: 2 },
    'claude-3-5-haiku': { input: 0.8, output: 4, cache_read: 0.08, cache_write: 1, cache_write_1h: 1.6 },
    'claude-3-opus': opus4,
    'claude-3-haiku': { input: 0.25, output: 1.25, cache_read: 0.03, cache_write: 0.3, cache_write_1h: 0.5 },
  };
}

const DATE_SUFFIX = /([-@]\d{8}|-latest|\[[0-9a-z]+\])$/;

function normalise(model: string): string {
  let m = model.trim().toLowerCase();
  for (;;) {
    const n = m.replace(DATE_SUFFIX, '');
    if (n === m) return m;
    m = n;
  }
}

/** The price of a model: exact, without its date suffix, the longest entry it extends, else the fallback's. */
export function lookupPrice(prices: Record<string, Price>, model: string): { price: Price; known: boolean } {
  const exact = Object.hasOwn(prices, model) ? prices[model] : undefined;
  if (exact) return { price: exact, known: true };
  const m = normalise(model);
  const plain = Object.hasOwn(prices, m) ? prices[m] : undefined;
  if (plain) return { price: plain, known: true };
  let best = '';
  for (const k of Object.keys(prices)) {
    if (k.length > best.length && m.startsWith(`${k}-`)) best = k;
  }
  if (best !== '') return { price: prices[best]!, known: true };
  return { price: prices[FALLBACK_MODEL] ?? defaultPrices()[FALLBACK_MODEL]!, known: false };
}

/** One call's cost in dollars. */
export function costOf(p: Price, u: Usage): number {
  if (p.long && p.long_above && u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens > p.long_above) {
    p = p.long;
  }
  const w1h = p.cache_write_1h || p.cache_write;
  const write1h = Math.min(Math.max(u.cache_creation_1h, 0), u.cache_creation_input_tokens);
  const write5m = u.cache_creation_input_tokens - write1h;
  return (u.input_tokens * p.input + u.output_tokens * p.output + u.cache_read_input_tokens * p.cache_read +
    write5m * p.cache_write + write1h * w1h) / 1e6;
}

/**
 * The built-in table with a JSON override ({"<model>":{"input","output",
 * "cache_read","cache_write"}}, dollars per million tokens) merged in. A
 * price that is not a finite number >= 0 throws, naming it.
 */
export function parsePrices(json: string | undefined): Record<string, Price> {
  const out = defaultPrices();
  if (json === undefined || json.trim() === '') return out;
  const v: unknown = JSON.parse(json);
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new Error('model prices: want a JSON object of models');
  for (const [model, p] of Object.entries(v as Record<string, unknown>)) {
    if (model === '') throw new Error('model prices: an empty model name');
    out[normalise(model)] = checkPrice(model, p, true);
  }
  return out;
}

function checkPrice(model: string, p: unknown, top: boolean): Price {
  if (p === null || typeof p !== 'object' || Array.isArray(p)) throw new Error(`model prices: ${model}: want an object`);
  const o = p as Record<string, unknown>;
  const num = (k: string, def?: number): number => {
    const x = o[k] ?? def ?? 0;
    if (typeof x !== 'number' || !Number.isFinite(x) || x < 0) throw new Error(`model prices: ${model}: ${k} must be a finite number >= 0`);
    return x;
  };
  const price: Price = { input: num('input'), output: num('output'), cache_read: num('cache_read'), cache_write: num('cache_write') };
  if (o['cache_write_1h'] !== undefined) price.cache_write_1h = num('cache_write_1h');
  if (o['long_above'] !== undefined) price.long_above = num('long_above');
  if (o['long'] !== undefined) {
    if (!top) throw new Error(`model prices: ${model}: long may not have a band of its own`);
    price.long = checkPrice(`${model}.long`, o['long'], false);
  }
  return price;
}
