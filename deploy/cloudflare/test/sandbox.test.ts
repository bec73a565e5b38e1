import { beforeEach, describe, expect, it, vi } from 'vitest';

vi.mock('@cloudflare/sandbox', async () => (await import('./fake-sdk')).sdkModule);

import { fakeFor, registry, resetFakes } from './fake-sdk';
import { bridge, call, json, makeEnv, req } from './helpers';

beforeEach(() => resetFakes());

const b = bridge({ maxFileBytes: 1024 });

describe('PUT /v1/sb/:id', () => {
  it('creates or wakes the sandbox with sleepAfter, keepAlive:false and answers {id, ready:true}', async () => {
    const resp = await call(b, req('PUT', '/v1/sb/Job_1-a', { body: { sleep_after: '15m' } }));
    expect(resp.status).toBe(200);
    expect(await json(resp)).toEqual({ id: 'Job_1-a', ready: true });
    expect(registry.calls.at(-1)).toEqual({ id: 'Job_1-a', options: { transport: 'rpc', sleepAfter: '15m', keepAlive: false } });
    // The container was touched (started) and the workspace exists.
    expect(fakeFor('Job_1-a').mkdir).toHaveBeenCalledWith('/workspace', { recursive: true });
  });

  it('is idempotent and accepts an empty body, defaulting sleep_after', async () => {
    for (let i = 0; i < 2; i++) {
      const resp = await call(b, req('PUT', '/v1/sb/s1'));
      expect(await json(resp)).toEqual({ id: 's1', ready: true });
    }
    expect(registry.calls.at(-1)?.options).toMatchObject({ sleepAfter: '10m', keepAlive: false });
    const resp = await call(b, req('PUT', '/v1/sb/s2', { body: { sleep_after: 300 } }), makeEnv({ SANDBOX_SLEEP_AFTER: '20m' }));
    expect(resp.status).toBe(200);
    expect(registry.calls.at(-1)?.options).toMatchObject({ sleepAfter: 300 });
    await call(b, req('PUT', '/v1/sb/s3'), makeEnv({ SANDBOX_SLEEP_AFTER: '20m' }));
    expect(registry.calls.at(-1)?.options).toMatchObject({ sleepAfter: '20m' });
  });

  it('sets allowed env with setEnvVars', async () => {
    await call(b, req('PUT', '/v1/sb/s1', { body: { env: { LANG: 'C.UTF-8', MAX_THINKING_TOKENS: '1024' } } }));
    expect(fakeFor('s1').setEnvVars).toHaveBeenCalledWith({ LANG: 'C.UTF-8', MAX_THINKING_TOKENS: '1024' });
  });

  it('never lets a secret-looking env var through (400 forbidden_env, nothing set)', async () => {
    for (const name of ['ANTHROPIC_API_KEY', 'ANTHROPIC_AUTH_TOKEN', 'BRIDGE_TOKEN', 'NPM_TOKEN', 'OPENAI_API_KEY', 'SSH_PRIVATE_KEY', 'my_secret', 'GIT_PASSWORD', 'AWS_SESSION_TOKEN']) {
      const resp = await call(b, req('PUT', '/v1/sb/s1', { body: { env: { SAFE: '1', [name]: 'sk-value-never-echoed' } } }));
      expect(resp.status, name).toBe(400);
      const body = await json(resp);
      expect(body.code).toBe('forbidden_env');
      expect(JSON.stringify(body)).not.toContain('sk-value-never-echoed');
    }
    expect(fakeFor('s1').setEnvVars).not.toHaveBeenCalled();
    expect(fakeFor('s1').mkdir).not.toHaveBeenCalled();
  });

  it('rejects a bad sleep_after', async () => {
    for (const v of ['10 minutes', -5, 0, '5d', true]) {
      const resp = await call(b, req('PUT', '/v1/sb/s1', { body: { sleep_after: v } }));
      expect(resp.status, String(v)).toBe(400);
      expect((await json(resp)).code).toBe('invalid_sleep_after');
    }
  });
});

describe('DELETE /v1/sb/:id', () => {
  it('destroys the sandbox and answers 204, idempotently', async () => {
    for (let i = 0; i < 2; i++) {
      const resp = await call(b, req('DELETE', '/v1/sb/s1'));
      expect(resp.status).toBe(204);
      expect(await resp.text()).toBe('');
    }
    expect(fakeFor('s1').destroy).toHaveBeenCalledTimes(2);
  });
});

describe('files', () => {
  it('writes raw bytes (base64 to the SDK) and reads them back byte-exact', async () => {
    const bytes = new Uint8Array([0, 1, 2, 0xff, 0xfe, 0x80, 10, 13, 0]);
    const put = await call(b, req('PUT', '/v1/sb/s1/file?path=q1/prompt.bin', { rawBody: bytes }));
    expect(put.status).toBe(204);
    const sb = fakeFor('s1');
    expect(sb.mkdir).toHaveBeenCalledWith('/workspace/q1', { recursive: true });
    expect(sb.writeFile).toHaveBeenCalledWith('/workspace/q1/prompt.bin', 'AAEC//6ACg0A', { encoding: 'base64' });
    const get = await call(b, req('GET', '/v1/sb/s1/file?path=/workspace/q1/prompt.bin'));
    expect(get.status).toBe(200);
    expect(get.headers.get('Content-Type')).toBe('application/octet-stream');
    expect(new Uint8Array(await get.arrayBuffer())).toEqual(bytes);
  });

  it('does not mkdir for a file at the workspace root and handles an empty file', async () => {
    const put = await call(b, req('PUT', '/v1/sb/s1/file?path=empty.txt', { rawBody: new Uint8Array() }));
    expect(put.status).toBe(204);
    expect(fakeFor('s1').mkdir).not.toHaveBeenCalled();
    const get = await call(b, req('GET', '/v1/sb/s1/file?path=./empty.txt'));
    expect(get.status).toBe(200);
    expect((await get.arrayBuffer()).byteLength).toBe(0);
  });

  it('confines paths to /workspace', async () => {
    const bad = ['', '/etc/passwd', '../etc/passwd', 'a/../../etc/passwd', '/workspace/../etc/passwd', '/workspacefoo/x', '/workspace', '/', '.', 'a\nb', '/tmp/x'];
    for (const p of bad) {
      const q = `/v1/sb/s1/file?path=${encodeURIComponent(p)}`;
      const put = await call(b, req('PUT', q, { rawBody: 'x' }));
      expect(put.status, `PUT ${JSON.stringify(p)}`).toBe(400);
      expect((await json(put)).code).toBe('invalid_path');
      const get = await call(b, req('GET', q));
      expect(get.status, `GET ${JSON.stringify(p)}`).toBe(400);
    }
    const missing = await call(b, req('GET', '/v1/sb/s1/file'));
    expect(missing.status).toBe(400);
    expect(fakeFor('s1').writeFile).not.toHaveBeenCalled();
    expect(fakeFor('s1').readFileStream).not.toHaveBeenCalled();
  });

  it('answers 404 file_not_found for a missing file', async () => {
    const resp = await call(b, req('GET', '/v1/sb/s1/file?path=nope.txt'));
    expect(resp.status).toBe(404);
    expect((await json(resp)).code).toBe('file_not_found');
  });

  it('answers 413 for a file over the limit', async () => {
    const resp = await call(b, req('PUT', '/v1/sb/s1/file?path=big', { rawBody: new Uint8Array(2048) }));
    expect(resp.status).toBe(413);
    expect((await json(resp)).code).toBe('payload_too_large');
    expect(fakeFor('s1').writeFile).not.toHaveBeenCalled();
  });
});
