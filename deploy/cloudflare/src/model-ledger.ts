// Where a Cloudflare run's model spend and events are kept (docs/gateway.md): in the
// storage of the sandbox's own Durable Object, so the metered egress
// (model-gateway.ts), which runs outside the object, and the bridge's routes
// see one record per sandbox whatever isolate serves them.
//
// RunStore is the record over the object's storage; objectLedger is the
// RunLedger the egress handler uses, calling the object by its sandbox id.
// The Go worker opens a run with its cap (and the query's spend so far),
// reads the events to publish them on .model, and closes it at the run's end
// with the metered total; a sandbox with no open run gets 401 on its calls.

import type { ModelEvent, RunLedger, RunState } from './model-gateway';

/** The part of DurableObjectStorage RunStore uses. */
export interface KeyValueStorage {
  get<T>(key: string): Promise<T | undefined>;
  put<T>(key: string, value: T): Promise<void>;
  delete(key: string): Promise<boolean>;
}

/** Who a run serves: the Go worker's numbering of its calls (docs/gateway.md, .model events). */
export interface RunMeta {
  tenant: string;
  query_id: string;
  attempt: number;
  /** The number of the run's first call (calls count from 1 per query, across attempts). */
  first_call: number;
}

interface StoredRun extends RunState {
  /** Events kept so far; event n (from 0) is under `model:ev:<n>`. */
  events: number;
  meta?: RunMeta;
}

/** A kept call as the bridge reports it: the event with its number and attempt. */
export type NumberedEvent = ModelEvent & { call: number; attempt: number };

/** What GET and DELETE /v1/sb/:id/model answer. */
export interface RunReport {
  events: NumberedEvent[];
  /** The cursor to ask from next (events kept so far). */
  next: number;
  spent_usd: number;
  max_cost_usd?: number;
  /** Whether the run reached its cap (its next call gets 402). */
  capped: boolean;
}

const RUN_KEY = 'model:run';
const eventKey = (n: number) => `model:ev:${n}`;

/** Most events kept per run; later ones still count towards the spend. */
export const MAX_EVENTS = 10_000;

/** One sandbox's model run, in its Durable Object's storage. */
export class RunStore {
  constructor(private readonly storage: KeyValueStorage) {}

  /** Opens a run (replacing any open one and its events). */
  async open(maxCostUSD: number | undefined, spentUSD = 0, meta?: RunMeta): Promise<void> {
    await this.close();
    const run: StoredRun = { spentUSD, events: 0 };
    if (maxCostUSD !== undefined) run.maxCostUSD = maxCostUSD;
    if (meta !== undefined) run.meta = meta;
    await this.storage.put(RUN_KEY, run);
  }

  async state(): Promise<RunState | undefined> {
    const r = await this.storage.get<StoredRun>(RUN_KEY);
    return r && { spentUSD: r.spentUSD, ...(r.maxCostUSD !== undefined ? { maxCostUSD: r.maxCostUSD } : {}) };
  }

  async record(ev: ModelEvent): Promise<void> {
    const r = await this.storage.get<StoredRun>(RUN_KEY);
    if (!r) return;
    r.spentUSD += ev.cost_usd;
    if (r.events < MAX_EVENTS) {
      await this.storage.put(eventKey(r.events), ev);
      r.events++;
    }
    await this.storage.put(RUN_KEY, r);
  }

  /** The events from index `from` on, with the run's spend so far. */
  async events(from: number): Promise<{ events: ModelEvent[]; spent_usd: number } | undefined> {
    const r = await this.storage.get<StoredRun>(RUN_KEY);
    if (!r) return undefined;
    const events: ModelEvent[] = [];
    for (let i = Math.max(0, Math.floor(from)); i < r.events; i++) {
      const ev = await this.storage.get<ModelEvent>(eventKey(i));
      if (ev) events.push(ev);
    }
    return { events, spent_usd: r.spentUSD };
  }

  /**
   * The run's report: its numbered events from index `from` on, the cursor
   * to ask from next, the spend and whether the cap is reached. Undefined
   * when no run is open.
   */
  async report(from: number): Promise<RunReport | undefined> {
    const r = await this.storage.get<StoredRun>(RUN_KEY);
    if (!r) return undefined;
    const first = r.meta?.first_call ?? 1;
    const attempt = r.meta?.attempt ?? 0;
    const events: NumberedEvent[] = [];
    const start = Math.max(0, Math.floor(from));
    for (let i = start; i < r.events; i++) {
      const ev = await this.storage.get<ModelEvent>(eventKey(i));
      if (ev) events.push({ call: first + i, attempt, ...ev });
    }
    const out: RunReport = { events, next: Math.max(start, r.events), spent_usd: r.spentUSD, capped: r.maxCostUSD !== undefined && r.spentUSD >= r.maxCostUSD };
    if (r.maxCostUSD !== undefined) out.max_cost_usd = r.maxCostUSD;
    return out;
  }

  /** Reports the run from `from` on (see report), then closes it. */
  async closeReport(from: number): Promise<RunReport | undefined> {
    const rep = await this.report(from);
    if (rep) await this.close();
    return rep;
  }

  /** Ends the run: its calls get 401 from now on. Returns its spend (undefined if none was open). */
  async close(): Promise<number | undefined> {
    const r = await this.storage.get<StoredRun>(RUN_KEY);
    if (!r) return undefined;
    for (let i = 0; i < r.events; i++) await this.storage.delete(eventKey(i));
    await this.storage.delete(RUN_KEY);
    return r.spentUSD;
  }
}

/** What objectLedger needs of the Sandbox object: two RPC methods over its RunStore (sandbox.ts). */
export interface ModelRunObject {
  modelState(): Promise<RunState | undefined>;
  modelRecord(ev: ModelEvent): Promise<void>;
}

/** The RunLedger of the egress handler: the sandbox's object, found by its id. */
export function objectLedger(get: (containerId: string) => ModelRunObject): RunLedger {
  return {
    state: (id) => get(id).modelState(),
    record: (id, ev) => get(id).modelRecord(ev),
  };
}
