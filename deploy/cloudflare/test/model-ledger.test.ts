import { describe, expect, it } from 'vitest';

import { meteredOutbound, type ModelEvent } from '../src/model-gateway';
import { MAX_EVENTS, objectLedger, RunStore, type KeyValueStorage } from '../src/model-ledger';
import { defaultPrices } from '../src/model-meter';

/** A Map behind the DurableObjectStorage calls RunStore makes. */
function memoryStorage(): KeyValueStorage & { map: Map<string, unknown> } {
  const map = new Map<string, unknown>();
  return {
    map,
    async get<T>(k: string) { return structuredClone(map.get(k)) as T | undefined; },
    async put<T>(k: string, v: T) { map.set(k, structuredClone(v)); },
    async delete(k: string) { return map.delete(k); },
  };
}

const ev = (cost: number): ModelEvent => ({ model: 'm', input_tokens: 1, output_tokens: 2, cache_read_input_tokens: 0, cache_creation_input_tokens: 0, cost_usd: cost, status: 200, ms: 3 });

describe('RunStore', () => {
  it('keeps a run’s spend and events until it is closed', async () => {
    const st = memoryStorage();
    const run = new RunStore(st);
    expect(await run.state()).toBeUndefined();
    await run.record(ev(1)); // no run open: nothing kept
    expect(st.map.size).toBe(0);
    await run.open(0.5, 0.1);
    expect(await run.state()).toEqual({ spentUSD: 0.1, maxCostUSD: 0.5 });
    await run.record(ev(0.2));
    await run.record(ev(0.3));
    expect(await run.events(1)).toEqual({ events: [ev(0.3)], spent_usd: 0.1 + 0.2 + 0.3 });
    expect(await run.close()).toBeCloseTo(0.6, 12);
    expect(st.map.size).toBe(0);
    expect(await run.events(0)).toBeUndefined();
    await run.open(undefined);
    expect(await run.state()).toEqual({ spentUSD: 0 });
  });

  it('counts every call but keeps at most MAX_EVENTS', async () => {
    const run = new RunStore(memoryStorage());
    await run.open(undefined);
    for (let i = 0; i < MAX_EVENTS + 3; i++) await run.record(ev(0.001));
    const got = await run.events(MAX_EVENTS - 1);
    expect(got!.events).toHaveLength(1);
    expect(got!.spent_usd).toBeCloseTo((MAX_EVENTS + 3) * 0.001, 9);
  });

  it('caps the egress through the object, per sandbox', async () => {
    const stores = new Map<string, RunStore>();
    const object = (id: string) => {
      if (!stores.has(id)) stores.set(id, new RunStore(memoryStorage()));
      const s = stores.get(id)!;
      return { modelState: () => s.state(), modelRecord: (e: ModelEvent) => s.record(e) };
    };
    const ledger = objectLedger(object);
    await object('a').modelState();
    await stores.get('a')!.open(0.001, 0.001); // already at its cap
    await stores.set('b', new RunStore(memoryStorage())).get('b')!.open(undefined);
    const req = () => new Request('https://api.anthropic.com/v1/messages', { method: 'POST', body: '{}' });
    const a = await meteredOutbound(req(), {}, { containerId: 'a' }, { ledger, prices: defaultPrices() });
    expect(a.status).toBe(402);
    const c = await meteredOutbound(req(), {}, { containerId: 'c' }, { ledger, prices: defaultPrices() });
    expect(c.status).toBe(401);
  });
});
