// The Sandbox Durable Object class bound as `Sandbox` in wrangler.jsonc.
//
// It is the SDK's Sandbox with egress locked down (see egress.ts): internet off
// except the allowed hosts, HTTPS interception on so the outbound handler can
// see and rewrite requests to api.anthropic.com. Those requests are metered
// and capped (model-gateway.ts) against the run the Go worker opened on this
// sandbox, kept in the object's own storage (model-ledger.ts): the RPC
// methods model* below are how the bridge's routes and the egress handler
// reach it.

import { Sandbox as BaseSandbox } from '@cloudflare/sandbox';
import { allowedHostsFrom, ANTHROPIC_HOST } from './egress';
import { gitOutbound } from './git-egress';
import type { Env } from './env';
import { meteredOutbound, type ModelEvent, type RunState } from './model-gateway';
import { objectLedger, RunStore, type KeyValueStorage, type ModelRunObject, type RunMeta, type RunReport } from './model-ledger';
import { parsePrices, type Price } from './model-meter';

export class Sandbox extends BaseSandbox<Env> {
  override interceptHttps = true;
  override enableInternet = false;

  constructor(ctx: DurableObjectState<{}>, env: Env) {
    super(ctx, env);
    this.allowedHosts = allowedHostsFrom(env.SANDBOX_ALLOWED_HOSTS);
  }

  private runStore(): RunStore {
    return new RunStore((this as unknown as { ctx: { storage: KeyValueStorage } }).ctx.storage);
  }

  /** Opens the sandbox's model run (replacing any open one). */
  async modelOpen(maxCostUSD: number | undefined, spentUSD: number, meta: RunMeta): Promise<void> {
    await this.runStore().open(maxCostUSD, spentUSD, meta);
  }

  /** The open run's spend and cap (the egress handler's check). */
  async modelState(): Promise<RunState | undefined> {
    return this.runStore().state();
  }

  /** Records one metered call. */
  async modelRecord(ev: ModelEvent): Promise<void> {
    await this.runStore().record(ev);
  }

  /** The open run's calls from `from` on, spend and cap state. */
  async modelReport(from: number): Promise<RunReport | undefined> {
    return this.runStore().report(from);
  }

  /** Reports from `from` on and closes the run: later calls get 401. */
  async modelClose(from: number): Promise<RunReport | undefined> {
    return this.runStore().closeReport(from);
  }
}

/** Prices, parsed once per isolate from the MODEL_PRICES var (a bad one fails every model call, loudly). */
let prices: { raw: string | undefined; table: Record<string, Price> } | undefined;

function pricesOf(env: Env): Record<string, Price> {
  if (!prices || prices.raw !== env.MODEL_PRICES) prices = { raw: env.MODEL_PRICES, table: parsePrices(env.MODEL_PRICES) };
  return prices.table;
}

/**
 * The egress handler for api.anthropic.com: the Worker's credential is added
 * (egress.ts) and the call is metered against the sandbox's open run; the
 * SDK names the sandbox by its Durable Object id (ctx.containerId).
 */
export async function modelOutbound(request: Request, env: Env, ctx: { containerId: string }): Promise<Response> {
  const ledger = objectLedger((id) => env.Sandbox.get(env.Sandbox.idFromString(id)) as unknown as ModelRunObject);
  return meteredOutbound(request, env, ctx, { ledger, prices: pricesOf(env) });
}

Sandbox.outboundByHost = {
  [ANTHROPIC_HOST]: modelOutbound,
};

// Every other intercepted request: git credentials from the GIT_CREDENTIALS
// secret for the hosts it lists, everything else unchanged (git-egress.ts).
Sandbox.outbound = gitOutbound;
