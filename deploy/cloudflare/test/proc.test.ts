import { beforeEach, describe, expect, it, vi } from 'vitest';

vi.mock('@cloudflare/sandbox', async () => (await import('./fake-sdk')).sdkModule);

import { CREDENTIAL_PLACEHOLDER } from '../src/egress';
import { buildCommand } from '../src/shell';
import { fakeFor, FakeSdkError, registry, resetFakes } from './fake-sdk';
import { bridge, call, json, makeEnv, req } from './helpers';

beforeEach(() => resetFakes());

const b = bridge();

describe('POST /v1/sb/:id/proc', () => {
  it('starts a process with the quoted argv, confined cwd and stdin, maps proc_id to processId', async () => {
    const argv = ['claude', '-p', '--output-format', 'stream-json', "it's $(rm -rf /) `x`"];
    const resp = await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'q1-a1', argv, cwd: 'repo', stdin_path: 'q1/prompt.txt' } }));
    expect(resp.status).toBe(200);
    const sb = fakeFor('s1');
    expect(await json(resp)).toEqual({ proc_id: 'q1-a1', pid: sb.procs.get('q1-a1')?.pid });
    expect(sb.startProcess).toHaveBeenCalledTimes(1);
    const [command, options] = sb.startProcess.mock.calls[0]!;
    expect(command).toBe(buildCommand({ argv, stdinPath: '/workspace/q1/prompt.txt' }));
    expect(command).toBe("'claude' '-p' '--output-format' 'stream-json' 'it'\\''s $(rm -rf /) `x`' < '/workspace/q1/prompt.txt'");
    expect(options).toMatchObject({ processId: 'q1-a1', cwd: '/workspace/repo', autoCleanup: false });
  });

  it('is idempotent on proc_id: a second start returns the same process without starting again', async () => {
    const body = { proc_id: 'p1', argv: ['sleep', '100'] };
    const r1 = await json(await call(b, req('POST', '/v1/sb/s1/proc', { body })));
    const r2 = await json(await call(b, req('POST', '/v1/sb/s1/proc', { body })));
    expect(r1).toEqual(r2);
    expect(r1.proc_id).toBe('p1');
    expect(typeof r1.pid).toBe('number');
    expect(fakeFor('s1').startProcess).toHaveBeenCalledTimes(1);
  });

  it('answers with the winner when a concurrent start of the same proc_id wins the race', async () => {
    const sb = fakeFor('s1');
    const command = buildCommand({ argv: ['true'] });
    // getProcess says "absent" first, then startProcess fails because the other request started it.
    sb.getProcess.mockResolvedValueOnce(null);
    sb.startProcess.mockImplementationOnce(async () => {
      sb.addProc({ id: 'p1', command, pid: 4242 });
      throw new FakeSdkError('PROCESS_ERROR', 'Process p1 already exists', 500);
    });
    const resp = await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'p1', argv: ['true'] } }));
    expect(resp.status).toBe(200);
    expect(await json(resp)).toEqual({ proc_id: 'p1', pid: 4242 });
  });

  it('answers 409 when proc_id already runs a different command', async () => {
    await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'p1', argv: ['true'] } }));
    const resp = await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'p1', argv: ['false'] } }));
    expect(resp.status).toBe(409);
    expect((await json(resp)).code).toBe('proc_id_conflict');
  });

  it('wraps timeout_ms with coreutils timeout', async () => {
    await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'p1', argv: ['agent'], timeout_ms: 90_000 } }));
    expect(fakeFor('s1').startProcess.mock.calls[0]![0]).toBe("timeout -k 10s -- 90s 'agent' < /dev/null");
  });

  it('passes filtered env plus the credential placeholder, never the real secret', async () => {
    const env = makeEnv({ ANTHROPIC_API_KEY: 'sk-ant-REAL-SECRET' });
    const resp = await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'p1', argv: ['claude'], env: { FOO: 'bar', CLAUDE_CODE_MAX_OUTPUT_TOKENS: '8000' } } }), env);
    expect(resp.status).toBe(200);
    const options = fakeFor('s1').startProcess.mock.calls[0]![1];
    expect(options?.env).toEqual({ ANTHROPIC_API_KEY: CREDENTIAL_PLACEHOLDER, FOO: 'bar', CLAUDE_CODE_MAX_OUTPUT_TOKENS: '8000' });
    expect(JSON.stringify(fakeFor('s1').startProcess.mock.calls)).not.toContain('REAL-SECRET');
  });

  it('uses the OAuth placeholder when only CLAUDE_CODE_OAUTH_TOKEN is configured', async () => {
    const env = makeEnv({ CLAUDE_CODE_OAUTH_TOKEN: 'oauth-REAL' });
    await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'p1', argv: ['claude'] } }), env);
    expect(fakeFor('s1').startProcess.mock.calls[0]![1]?.env).toEqual({ CLAUDE_CODE_OAUTH_TOKEN: CREDENTIAL_PLACEHOLDER });
  });

  it('rejects secret-looking env names with 400 forbidden_env and starts nothing', async () => {
    for (const name of ['ANTHROPIC_API_KEY', 'CLAUDE_CODE_OAUTH_TOKEN', 'GITHUB_TOKEN', 'AWS_SECRET_ACCESS_KEY', 'DB_PASSWORD', 'ANTHROPIC_BASE_URL']) {
      const resp = await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'p1', argv: ['x'], env: { [name]: 'v' } } }));
      expect(resp.status, name).toBe(400);
      const body = await json(resp);
      expect(body.code).toBe('forbidden_env');
      expect(String(body.error)).toContain(name);
    }
    expect(fakeFor('s1').startProcess).not.toHaveBeenCalled();
  });

  it('rejects invalid bodies with 400 and a specific code', async () => {
    const cases: Array<[unknown, string]> = [
      [{ argv: ['x'] }, 'invalid_proc_id'],
      [{ proc_id: 'a/b', argv: ['x'] }, 'invalid_proc_id'],
      [{ proc_id: 'p', argv: [] }, 'invalid_argv'],
      [{ proc_id: 'p', argv: 'ls -la' }, 'invalid_argv'],
      [{ proc_id: 'p', argv: ['x'], cwd: '/etc' }, 'invalid_path'],
      [{ proc_id: 'p', argv: ['x'], cwd: '../x' }, 'invalid_path'],
      [{ proc_id: 'p', argv: ['x'], stdin_path: '/etc/shadow' }, 'invalid_path'],
      [{ proc_id: 'p', argv: ['x'], stdin_path: 'a/../../etc/shadow' }, 'invalid_path'],
      [{ proc_id: 'p', argv: ['x'], timeout_ms: -1 }, 'invalid_timeout'],
      [{ proc_id: 'p', argv: ['x'], timeout_ms: 1.5 }, 'invalid_timeout'],
      [{ proc_id: 'p', argv: ['x'], env: { 'BAD-NAME': 'v' } }, 'invalid_env'],
      [{ proc_id: 'p', argv: ['x'], env: { A: 1 } }, 'invalid_env'],
      [[1, 2], 'invalid_json'],
    ];
    for (const [body, code] of cases) {
      const resp = await call(b, req('POST', '/v1/sb/s1/proc', { body }));
      expect(resp.status, JSON.stringify(body)).toBe(400);
      expect((await json(resp)).code, JSON.stringify(body)).toBe(code);
    }
    const bad = await call(b, req('POST', '/v1/sb/s1/proc', { rawBody: '{not json', headers: { 'Content-Type': 'application/json' } }));
    expect((await json(bad)).code).toBe('invalid_json');
    expect(fakeFor('s1').startProcess).not.toHaveBeenCalled();
  });

  it('rejects an invalid sandbox id', async () => {
    const resp = await call(b, req('POST', '/v1/sb/bad.id/proc', { body: { proc_id: 'p', argv: ['x'] } }));
    expect(resp.status).toBe(400);
    expect((await json(resp)).code).toBe('invalid_id');
  });

  it('maps SDK failures: container unavailable → 503, interrupted → 409, unknown → 502', async () => {
    const logged = vi.spyOn(console, 'error').mockImplementation(() => {});
    const sb = fakeFor('s1');
    const cases: Array<[Error, number, string]> = [
      [new FakeSdkError('CONTAINER_UNAVAILABLE', 'container not ready', 503), 503, 'container_unavailable'],
      [new FakeSdkError('OPERATION_INTERRUPTED', 'container replaced', 409), 409, 'operation_interrupted'],
      [new Error('There is no container instance that can be provided'), 503, 'container_unavailable'],
      [new Error('boom'), 502, 'sandbox_error'],
    ];
    for (const [err, status, code] of cases) {
      sb.startError = err;
      const resp = await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'p1', argv: ['x'] } }));
      expect(resp.status, err.message).toBe(status);
      expect((await json(resp)).code).toBe(code);
    }
    // 5xx are logged with route and code only: never the command or env.
    expect(logged).toHaveBeenCalledTimes(3);
    for (const [line] of logged.mock.calls) {
      expect(JSON.parse(String(line))).toEqual({ msg: 'bridge error', method: 'POST', path: '/v1/sb/s1/proc', status: expect.any(Number), code: expect.any(String) });
    }
    logged.mockRestore();
  });

  it('passes the configured transport to getSandbox', async () => {
    await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'p1', argv: ['x'] } }), makeEnv({ SANDBOX_TRANSPORT: 'http' }));
    expect(registry.calls.at(-1)?.options).toMatchObject({ transport: 'http' });
    await call(b, req('GET', '/v1/sb/s1/proc/p1'));
    expect(registry.calls.at(-1)?.options).toMatchObject({ transport: 'rpc' });
  });
});

describe('GET /v1/sb/:id/proc/:proc_id', () => {
  it('reports status and exit_code', async () => {
    const sb = fakeFor('s1');
    sb.addProc({ id: 'run', status: 'running' });
    sb.addProc({ id: 'ok', status: 'completed', exitCode: 0 });
    sb.addProc({ id: 'bad', status: 'failed', exitCode: 3 });
    sb.addProc({ id: 'err', status: 'error' });
    sb.addProc({ id: 'k', status: 'killed', exitCode: 143 });
    const get = async (p: string) => json(await call(b, req('GET', `/v1/sb/s1/proc/${p}`)));
    expect(await get('run')).toEqual({ status: 'running' });
    expect(await get('ok')).toEqual({ status: 'completed', exit_code: 0 });
    expect(await get('bad')).toEqual({ status: 'failed', exit_code: 3 });
    expect(await get('err')).toEqual({ status: 'failed' });
    expect(await get('k')).toEqual({ status: 'killed', exit_code: 143 });
  });

  it('answers 404 proc_not_found for an unknown process', async () => {
    const resp = await call(b, req('GET', '/v1/sb/s1/proc/nope'));
    expect(resp.status).toBe(404);
    expect((await json(resp)).code).toBe('proc_not_found');
  });
});

describe('POST /v1/sb/:id/proc/:proc_id/kill', () => {
  it('kills a running process and reports killed:true', async () => {
    const sb = fakeFor('s1');
    sb.addProc({ id: 'p1' });
    const resp = await call(b, req('POST', '/v1/sb/s1/proc/p1/kill', { body: { signal: 'SIGKILL' } }));
    expect(resp.status).toBe(200);
    expect(await json(resp)).toEqual({ killed: true });
    expect(sb.killProcess).toHaveBeenCalledWith('p1', 'SIGKILL');
  });

  it('accepts an empty body and a short signal name', async () => {
    const sb = fakeFor('s1');
    sb.addProc({ id: 'p1' });
    sb.addProc({ id: 'p2' });
    expect((await call(b, req('POST', '/v1/sb/s1/proc/p1/kill'))).status).toBe(200);
    expect(sb.killProcess).toHaveBeenLastCalledWith('p1', undefined);
    expect((await call(b, req('POST', '/v1/sb/s1/proc/p2/kill', { body: { signal: 'term' } }))).status).toBe(200);
    expect(sb.killProcess).toHaveBeenLastCalledWith('p2', 'SIGTERM');
  });

  it('reports killed:false for a process that already exited', async () => {
    const sb = fakeFor('s1');
    sb.addProc({ id: 'p1', status: 'completed', exitCode: 0 });
    expect(await json(await call(b, req('POST', '/v1/sb/s1/proc/p1/kill')))).toEqual({ killed: false });
    expect(sb.killProcess).not.toHaveBeenCalled();
  });

  it('answers 404 for an unknown process and 400 for an unknown signal', async () => {
    expect((await call(b, req('POST', '/v1/sb/s1/proc/none/kill'))).status).toBe(404);
    fakeFor('s1').addProc({ id: 'p1' });
    const resp = await call(b, req('POST', '/v1/sb/s1/proc/p1/kill', { body: { signal: 'SIGSEGV' } }));
    expect(resp.status).toBe(400);
    expect((await json(resp)).code).toBe('invalid_signal');
  });
});

describe('routing', () => {
  it('answers 404 for unknown routes and 405 for wrong methods', async () => {
    expect((await call(b, req('GET', '/v2/sb/s1'))).status).toBe(404);
    expect((await call(b, req('GET', '/v1/sb/s1/proc/p1/nope'))).status).toBe(404);
    const r = await call(b, req('GET', '/v1/sb/s1'));
    expect(r.status).toBe(405);
    expect(r.headers.get('Allow')).toBe('PUT, DELETE');
    expect((await json(r)).code).toBe('method_not_allowed');
    expect((await call(b, req('DELETE', '/v1/sb/s1/proc'))).status).toBe(405);
  });
});
