// The bridge's model-run routes (docs/gateway.md): how the Go worker opens, reads
// and closes the metered run of a sandbox. The run lives in the sandbox's
// Durable Object (sandbox.ts, model-ledger.ts); the container's calls to
// api.anthropic.com are metered against it at the egress (model-gateway.ts).
//
//   PUT    /v1/sb/:id/model          {tenant, query_id, attempt, first_call, max_cost_usd?, spent_usd?} → {open: true}
//   GET    /v1/sb/:id/model?from=N   {events, next, spent_usd, max_cost_usd?, capped}; 404 model_run_not_found
//   DELETE /v1/sb/:id/model?from=N   the same report, then the run is closed (later calls get 401); 404 if none
//
// Nothing secret is taken or returned: the credential is the Worker's own
// secret, added at the egress.

import { HttpError, invalid, jsonResponse } from './errors';
import type { RunMeta, RunReport } from './model-ledger';

/** The Sandbox object's model RPC methods (sandbox.ts). */
export interface ModelApi {
  modelOpen(maxCostUSD: number | undefined, spentUSD: number, meta: RunMeta): Promise<void>;
  modelReport(from: number): Promise<RunReport | undefined>;
  modelClose(from: number): Promise<RunReport | undefined>;
}

function label(v: unknown, what: string): string {
  if (typeof v !== 'string' || v === '' || v.length > 256 || /[\x00-\x1f]/.test(v)) {
    throw invalid('invalid_model_run', `${what} must be a non-empty string of at most 256 characters without control characters`);
  }
  return v;
}

function integer(v: unknown, what: string, min: number): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) throw invalid('invalid_model_run', `${what} must be an integer >= ${min}`);
  return v;
}

function dollars(v: unknown, what: string, positive: boolean): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0 || (positive && v === 0) || v > 1e9) {
    throw invalid('invalid_model_run', `${what} must be a finite number ${positive ? '> 0' : '>= 0'}, at most 1e9`);
  }
  return v;
}

/** Reads PUT /model's body. */
export function parseModelOpen(body: Record<string, unknown>): { maxCostUSD: number | undefined; spentUSD: number; meta: RunMeta } {
  const meta: RunMeta = {
    tenant: label(body.tenant, 'tenant'),
    query_id: label(body.query_id, 'query_id'),
    attempt: integer(body.attempt, 'attempt', 0),
    first_call: integer(body.first_call, 'first_call', 1),
  };
  let maxCostUSD: number | undefined;
  if (body.max_cost_usd !== undefined && body.max_cost_usd !== null) {
    // Not bounded by a job's 10,000: the worker may send the query's spend
    // plus what is left of the tenant's budget.
    maxCostUSD = dollars(body.max_cost_usd, 'max_cost_usd', true);
  }
  const spentUSD = body.spent_usd === undefined || body.spent_usd === null ? 0 : dollars(body.spent_usd, 'spent_usd', false);
  return { maxCostUSD, spentUSD, meta };
}

/** Reads the from= cursor (absent: 0). */
export function parseCursor(raw: string | null): number {
  if (raw === null || raw === '') return 0;
  if (!/^[0-9]{1,9}$/.test(raw)) throw invalid('invalid_offset', 'from must be a non-negative integer');
  return Number(raw);
}

function noRun(id: string): HttpError {
  return new HttpError(404, 'model_run_not_found', `no model run is open in sandbox ${id}`);
}

export async function openModelRun(sb: ModelApi, body: Record<string, unknown>): Promise<Response> {
  const { maxCostUSD, spentUSD, meta } = parseModelOpen(body);
  await sb.modelOpen(maxCostUSD, spentUSD, meta);
  return jsonResponse({ open: true });
}

export async function reportModelRun(sb: ModelApi, id: string, url: URL): Promise<Response> {
  const rep = await sb.modelReport(parseCursor(url.searchParams.get('from')));
  if (!rep) throw noRun(id);
  return jsonResponse(rep);
}

export async function closeModelRun(sb: ModelApi, id: string, url: URL): Promise<Response> {
  const rep = await sb.modelClose(parseCursor(url.searchParams.get('from')));
  if (!rep) throw noRun(id);
  return jsonResponse(rep);
}
