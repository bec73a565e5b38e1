import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

vi.mock('@cloudflare/sandbox', async () => (await import('./fake-sdk')).sdkModule);

import { bearerToken, constantTimeEqual, xorEqual } from '../src/auth';
import { fakeFor, resetFakes } from './fake-sdk';
import { bridge, call, json, makeEnv, req, TOKEN } from './helpers';

beforeEach(() => resetFakes());

describe('auth', () => {
  const b = bridge();

  it('rejects a request without Authorization with 401 unauthorized', async () => {
    const resp = await call(b, req('GET', '/v1/sb/s1/proc/p1', { token: null }));
    expect(resp.status).toBe(401);
    expect(resp.headers.get('WWW-Authenticate')).toBe('Bearer');
    expect(await json(resp)).toEqual({ error: expect.any(String), code: 'unauthorized' });
    expect(fakeFor('s1').getProcess).not.toHaveBeenCalled();
  });

  it('rejects a wrong token of the same length and of another length', async () => {
    const sameLen = TOKEN.slice(0, -1) + (TOKEN.endsWith('f') ? 'e' : 'f');
    for (const t of [sameLen, 'x', TOKEN + 'x', TOKEN.slice(0, 5)]) {
      const resp = await call(b, req('GET', '/v1/sb/s1/proc/p1', { token: t }));
      expect(resp.status, t).toBe(401);
      expect((await json(resp)).code).toBe('unauthorized');
    }
  });

  it('rejects a non-Bearer scheme carrying the right token', async () => {
    const resp = await call(b, req('GET', '/v1/sb/s1/proc/p1', { token: null, headers: { Authorization: `Basic ${TOKEN}` } }));
    expect(resp.status).toBe(401);
  });

  it('lets the right token through to the route', async () => {
    fakeFor('s1').addProc({ id: 'p1', status: 'running' });
    const resp = await call(b, req('GET', '/v1/sb/s1/proc/p1'));
    expect(resp.status).toBe(200);
    expect(await json(resp)).toEqual({ status: 'running' });
  });

  it('refuses every route but /healthz with 503 not_configured when BRIDGE_TOKEN is unset or empty', async () => {
    for (const env of [makeEnv({ BRIDGE_TOKEN: undefined }), makeEnv({ BRIDGE_TOKEN: '' })]) {
      for (const r of [
        req('PUT', '/v1/sb/s1', { body: {} }),
        req('GET', '/v1/sb/s1/proc/p1'),
        req('GET', '/nope'),
        req('DELETE', '/v1/sb/s1', { token: null }),
      ]) {
        const resp = await call(b, r, env);
        expect(resp.status).toBe(503);
        expect((await json(resp)).code).toBe('not_configured');
      }
    }
    expect(fakeFor('s1').mkdir).not.toHaveBeenCalled();
    expect(fakeFor('s1').destroy).not.toHaveBeenCalled();
  });

  it('serves /healthz without a token, configured or not', async () => {
    for (const env of [makeEnv(), makeEnv({ BRIDGE_TOKEN: undefined })]) {
      const resp = await call(b, req('GET', '/healthz', { token: null }), env);
      expect(resp.status).toBe(200);
      expect(await json(resp)).toEqual({ ok: true });
    }
  });
});

describe('constant-time comparison', () => {
  // Workers types declare timingSafeEqual; Node lacks it. Treat it as optional here.
  const subtle = crypto.subtle as unknown as { timingSafeEqual?: unknown };
  const had = Object.prototype.hasOwnProperty.call(subtle, 'timingSafeEqual');
  const original = subtle.timingSafeEqual;

  afterEach(() => {
    if (had) subtle.timingSafeEqual = original;
    else delete subtle.timingSafeEqual;
  });

  it('compares SHA-256 digests with crypto.subtle.timingSafeEqual when the runtime has it', async () => {
    const spy = vi.fn((a: ArrayBufferView, b: ArrayBufferView) => xorEqual(new Uint8Array(a.buffer, a.byteOffset, a.byteLength), new Uint8Array(b.buffer, b.byteOffset, b.byteLength)));
    subtle.timingSafeEqual = spy;
    expect(await constantTimeEqual('short', 'a much longer expected token')).toBe(false);
    expect(await constantTimeEqual(TOKEN, TOKEN)).toBe(true);
    expect(spy).toHaveBeenCalledTimes(2);
    // Always two 32-byte digests, whatever the input lengths: no length leak.
    for (const [a, b] of spy.mock.calls) {
      expect(a.byteLength).toBe(32);
      expect(b.byteLength).toBe(32);
    }
  });

  it('falls back to the XOR loop without timingSafeEqual', async () => {
    delete subtle.timingSafeEqual;
    expect(await constantTimeEqual('abc', 'abc')).toBe(true);
    expect(await constantTimeEqual('abc', 'abd')).toBe(false);
    expect(await constantTimeEqual('abc', 'abcd')).toBe(false);
    expect(await constantTimeEqual('', 'abc')).toBe(false);
  });

  it('the bridge runs the digest comparison even when no token is sent', async () => {
    const spy = vi.fn(() => false);
    subtle.timingSafeEqual = spy;
    const resp = await call(bridge(), req('GET', '/v1/sb/s1/proc/p1', { token: null }));
    expect(resp.status).toBe(401);
    expect(spy).toHaveBeenCalledTimes(1);
  });

  it('xorEqual and bearerToken handle edge cases', () => {
    expect(xorEqual(new Uint8Array([1, 2]), new Uint8Array([1, 2]))).toBe(true);
    expect(xorEqual(new Uint8Array([1, 2]), new Uint8Array([1, 3]))).toBe(false);
    expect(xorEqual(new Uint8Array([1]), new Uint8Array([1, 0]))).toBe(false);
    const r = (h: string) => new Request('https://x/', { headers: { Authorization: h } });
    expect(bearerToken(r('Bearer abc'))).toBe('abc');
    expect(bearerToken(r('bearer  abc '))).toBe('abc');
    expect(bearerToken(r('Bearer a b'))).toBeNull();
    expect(bearerToken(r('Bearer '))).toBeNull();
    expect(bearerToken(new Request('https://x/'))).toBeNull();
  });
});
