// Test helpers: requests, a fake ExecutionContext, an SSE reader.

import { createBridge, type BridgeOptions } from '../src/bridge';
import type { Env } from '../src/env';

export const TOKEN = 'test-bridge-token-0123456789abcdef';
export const BASE = 'https://bridge.example';

export function makeEnv(over: Partial<Env> = {}): Env {
  return { Sandbox: {} as Env['Sandbox'], BRIDGE_TOKEN: TOKEN, ...over };
}

export class FakeCtx {
  readonly promises: Promise<unknown>[] = [];
  readonly props = {};
  waitUntil(p: Promise<unknown>): void {
    this.promises.push(p);
  }
  passThroughOnException(): void {}
}

export interface ReqInit {
  body?: unknown;
  rawBody?: BodyInit;
  token?: string | null;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

export function req(method: string, path: string, init: ReqInit = {}): Request {
  const headers: Record<string, string> = { ...init.headers };
  const token = init.token === undefined ? TOKEN : init.token;
  if (token !== null) headers.Authorization = `Bearer ${token}`;
  let body: BodyInit | undefined = init.rawBody;
  if (init.body !== undefined) {
    body = JSON.stringify(init.body);
    headers['Content-Type'] = 'application/json';
  }
  const ri: RequestInit = { method, headers };
  if (body !== undefined) ri.body = body;
  if (init.signal) ri.signal = init.signal;
  return new Request(`${BASE}${path}`, ri);
}

export type Bridge = ReturnType<typeof createBridge>;

export function bridge(opts: BridgeOptions = {}): Bridge {
  return createBridge(opts);
}

/** Calls the Worker's fetch handler. */
export async function call(b: Bridge, r: Request, env: Env = makeEnv(), ctx: FakeCtx = new FakeCtx()): Promise<Response> {
  const fetchFn = b.fetch as unknown as (r: Request, e: Env, c: ExecutionContext) => Promise<Response>;
  return fetchFn(r, env, ctx as unknown as ExecutionContext);
}

export async function json(resp: Response): Promise<Record<string, unknown>> {
  return (await resp.json()) as Record<string, unknown>;
}

/** One SSE item: an event (with data and id) or a comment. */
export interface SSEItem {
  event?: string;
  data?: string;
  id?: string;
  comment?: string;
}

/** Incremental SSE reader over a response body, for tests. */
export class SSEReader {
  private readonly reader: ReadableStreamDefaultReader<Uint8Array>;
  private readonly decoder = new TextDecoder();
  private buf = '';
  private pending: SSEItem[] = [];
  private ended = false;

  constructor(resp: Response) {
    if (!resp.body) throw new Error('response has no body');
    this.reader = resp.body.getReader();
  }

  private parseBlock(block: string): void {
    const item: SSEItem = {};
    const data: string[] = [];
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) {
        this.pending.push({ comment: line.slice(1).trim() });
        continue;
      }
      const i = line.indexOf(':');
      const field = i < 0 ? line : line.slice(0, i);
      const value = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
      if (field === 'event') item.event = value;
      else if (field === 'data') data.push(value);
      else if (field === 'id') item.id = value;
    }
    if (item.event !== undefined || data.length > 0) {
      if (data.length > 0) item.data = data.join('\n');
      this.pending.push(item);
    }
  }

  /** Next item, or null at the end of the stream. */
  async next(): Promise<SSEItem | null> {
    for (;;) {
      const item = this.pending.shift();
      if (item) return item;
      if (this.ended) return null;
      const { done, value } = await this.reader.read();
      if (done) {
        this.ended = true;
        if (this.buf.trim() !== '') this.parseBlock(this.buf);
        this.buf = '';
        continue;
      }
      this.buf += this.decoder.decode(value, { stream: true });
      let idx = this.buf.indexOf('\n\n');
      while (idx >= 0) {
        this.parseBlock(this.buf.slice(0, idx));
        this.buf = this.buf.slice(idx + 2);
        idx = this.buf.indexOf('\n\n');
      }
    }
  }

  /** Next event (skipping comments), or null at the end. */
  async nextEvent(): Promise<SSEItem | null> {
    for (;;) {
      const it = await this.next();
      if (it === null || it.comment === undefined) return it;
    }
  }

  /** All remaining events (skipping comments) until the stream ends. */
  async rest(): Promise<SSEItem[]> {
    const out: SSEItem[] = [];
    for (;;) {
      const it = await this.nextEvent();
      if (it === null) return out;
      out.push(it);
    }
  }

  async cancel(): Promise<void> {
    await this.reader.cancel();
  }
}

/** Decodes an `out` event's payload. */
export function outOf(item: SSEItem): { fd: number; off: number; text: string; bytes: Uint8Array } {
  const d = JSON.parse(item.data ?? '{}') as { fd: number; off: number; b64: string };
  const bin = atob(d.b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return { fd: d.fd, off: d.off, text: new TextDecoder().decode(bytes), bytes };
}
