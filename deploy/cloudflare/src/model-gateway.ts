// The model gateway at the bridge's egress (docs/gateway.md): the Cloudflare
// counterpart of the Go worker's pkg/gateway. Requests the container
// sends to api.anthropic.com get the Worker's credential (egress.ts), and
// here they are also metered and capped:
//
//   POST /v1/messages                        forwarded, metered; 402 once the run's cap is reached
//   POST /v1/messages/count_tokens, GET /v1/models[/…]   forwarded, not metered
//   anything else                            404 not_found_error, not forwarded
//
// The run a sandbox serves is found by the container id the SDK passes to
// an outbound handler. Its spend, cap and events live in a RunLedger (the
// Sandbox Durable Object's storage in production; MemoryLedger in tests);
// the Go worker reads the events and publishes them on .model, and reads the
// spend for the terminal status. The answer's bytes pass unchanged, chunk by
// chunk; usage is read as they pass (model-meter.ts).

import { anthropicOutbound, type EgressEnv } from './egress';
import { costOf, decodeMessage, emptyUsage, lookupPrice, SSEUsageMeter, type Price, type Usage } from './model-meter';

/** One call, as published on fleet.query.<tenant>.<id>.model (call and attempt are the Go worker's to number). */
export interface ModelEvent {
  model: string;
  input_tokens: number;
  output_tokens: number;
  cache_read_input_tokens: number;
  cache_creation_input_tokens: number;
  cost_usd: number;
  status: number;
  ms: number;
}

/** A run's metering state. */
export interface RunState {
  /** What the run has spent so far (its earlier attempts' included). */
  spentUSD: number;
  /** The job's max_cost_usd (or what is left of the tenant's budget, if less); undefined = no cap. */
  maxCostUSD?: number;
}

/** Where runs' spend and events are kept, keyed by container (sandbox) id. */
export interface RunLedger {
  /** The run a sandbox serves, or undefined when none is open (its calls get 401). */
  state(containerId: string): Promise<RunState | undefined>;
  /** Adds one call's cost to the run and keeps its event. */
  record(containerId: string, ev: ModelEvent): Promise<void>;
}

/** An in-memory RunLedger (tests, and a single Worker isolate). */
export class MemoryLedger implements RunLedger {
  readonly runs = new Map<string, RunState & { events: ModelEvent[] }>();

  open(containerId: string, maxCostUSD?: number, spentUSD = 0): void {
    this.runs.set(containerId, { spentUSD, maxCostUSD, events: [] });
  }

  close(containerId: string): void {
    this.runs.delete(containerId);
  }

  async state(containerId: string): Promise<RunState | undefined> {
    return this.runs.get(containerId);
  }

  async record(containerId: string, ev: ModelEvent): Promise<void> {
    const r = this.runs.get(containerId);
    if (!r) return;
    r.spentUSD += ev.cost_usd;
    r.events.push(ev);
  }
}

export interface GatewayOptions {
  ledger: RunLedger;
  prices: Record<string, Price>;
  /** Milliseconds now (injected by tests). */
  now?: () => number;
}

/** Most of a non-streaming answer kept to read its usage. */
const MAX_JSON_BYTES = 16 << 20;

function apiError(status: number, type: string, message: string, extra?: Record<string, string>): Response {
  return new Response(JSON.stringify({ type: 'error', error: { type, message } }), {
    status,
    headers: { 'Content-Type': 'application/json', ...extra },
  });
}

/**
 * A model id in GET /v1/models/{id}: lower-case letters and digits joined
 * by single '-', '_' or '.', so never a dot segment, an encoded slash
 * (`..%2f`), a backslash or anything else that needs encoding.
 */
const MODEL_PATH = /^\/v1\/models\/[a-z0-9]+(?:[._-][a-z0-9]+)*$/;

/**
 * Whether an unmetered request is forwarded: token counting and the model
 * list cost nothing. Exact paths only (the URL parser has already resolved
 * `..` and `%2e%2e` segments; what is left must match exactly).
 */
function passThrough(method: string, path: string): boolean {
  if (method === 'POST' && path === '/v1/messages/count_tokens') return true;
  return method === 'GET' && (path === '/v1/models' || (path.length <= 140 && MODEL_PATH.test(path)));
}

/**
 * The outbound handler for api.anthropic.com with metering and caps. ctx is
 * the SDK's outbound handler context (its containerId names the sandbox).
 */
export async function meteredOutbound(
  request: Request,
  env: EgressEnv,
  ctx: { containerId: string },
  opts: GatewayOptions,
): Promise<Response> {
  const now = opts.now ?? Date.now;
  const path = new URL(request.url).pathname;
  const metered = request.method === 'POST' && path === '/v1/messages';
  if (!metered && !passThrough(request.method, path)) {
    return apiError(404, 'not_found_error', 'the model gateway forwards only the Messages API (/v1/messages, /v1/messages/count_tokens, /v1/models)');
  }
  const run = await opts.ledger.state(ctx.containerId);
  if (!run) return apiError(401, 'authentication_error', 'no run is open in this sandbox');
  if (!metered) return anthropicOutbound(request, env);
  if (run.maxCostUSD !== undefined && run.spentUSD >= run.maxCostUSD) {
    return apiError(402, 'billing_error',
      `the run reached its max_cost_usd: $${run.spentUSD.toFixed(4)} spent of $${run.maxCostUSD.toFixed(4)}`,
      { 'x-should-retry': 'false' });
  }
  const start = now();
  const resp = await anthropicOutbound(request, env);
  const record = (model: string, usage: Usage) => {
    const cost = costOf(lookupPrice(opts.prices, model).price, usage);
    return opts.ledger.record(ctx.containerId, {
      model, input_tokens: usage.input_tokens, output_tokens: usage.output_tokens,
      cache_read_input_tokens: usage.cache_read_input_tokens, cache_creation_input_tokens: usage.cache_creation_input_tokens,
      cost_usd: cost, status: resp.status, ms: now() - start,
    });
  };
  if (resp.status !== 200 || resp.body === null) {
    if (resp.status !== 401) await record('', emptyUsage()); // a 401 is the Worker's own (no secret): no call
    return resp;
  }
  const sse = (resp.headers.get('content-type') ?? '').startsWith('text/event-stream');
  const meter = sse ? new SSEUsageMeter() : undefined;
  const kept: Uint8Array[] = [];
  let keptBytes = 0;
  let done = false;
  const finish = async () => {
    if (done) return;
    done = true;
    if (meter) return record(meter.model, meter.usage);
    const all = new Uint8Array(keptBytes);
    let off = 0;
    for (const c of kept) {
      all.set(c, off);
      off += c.length;
    }
    const m = decodeMessage(new TextDecoder().decode(all));
    return record(m?.model ?? '', m?.usage ?? emptyUsage());
  };
  const reader = resp.body.getReader();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      let r: ReadableStreamReadResult<Uint8Array>;
      try {
        r = await reader.read();
      } catch (err) {
        await finish();
        controller.error(err);
        return;
      }
      if (r.done) {
        await finish();
        controller.close();
        return;
      }
      if (meter) {
        meter.write(r.value);
      } else if (keptBytes + r.value.length <= MAX_JSON_BYTES) {
        kept.push(r.value);
        keptBytes += r.value.length;
      }
      controller.enqueue(r.value);
    },
    async cancel(reason) {
      await finish();
      await reader.cancel(reason);
    },
  });
  return new Response(body, { status: resp.status, statusText: resp.statusText, headers: resp.headers });
}
