import { beforeEach, describe, expect, it, vi } from 'vitest';

vi.mock('@cloudflare/sandbox', async () => (await import('./fake-sdk')).sdkModule);

import { BRIDGE_VERSION } from '../src/version';
import { resetFakes } from './fake-sdk';
import { bridge, call, json, req } from './helpers';

beforeEach(() => resetFakes());

describe('GET /v1/version', () => {
  const b = bridge();

  it('answers the bridge version and what it supports, which a worker of this release needs', async () => {
    const resp = await call(b, req('GET', '/v1/version'));
    expect(resp.status).toBe(200);
    const body = await json(resp);
    expect(body).toEqual({ version: BRIDGE_VERSION, capabilities: expect.any(Array) });
    // What the Go worker checks (sandbox.BridgeNeeds).
    expect(body.capabilities).toEqual(expect.arrayContaining(['model', 'stdin']));
  });

  it('needs the bearer token like every /v1 route', async () => {
    const resp = await call(b, req('GET', '/v1/version', { token: null }));
    expect(resp.status).toBe(401);
  });

  it('takes only GET', async () => {
    const resp = await call(b, req('POST', '/v1/version', { body: {} }));
    expect(resp.status).toBe(405);
  });
});
