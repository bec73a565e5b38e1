import { beforeEach, describe, expect, it, vi } from 'vitest';

vi.mock('@cloudflare/sandbox', async () => (await import('./fake-sdk')).sdkModule);

import { spawnSync } from 'node:child_process';
import { buildCommand, shellQuote } from '../src/shell';
import { appendCommand, ensureFifo, holderCommand, holderId, MAX_STDIN_WRITE, planWrite, stdinPaths } from '../src/stdin';
import { fakeFor, resetFakes } from './fake-sdk';
import { bridge, call, json, req } from './helpers';

beforeEach(() => resetFakes());

const b = bridge();
const sp = stdinPaths('p1');
const dec = new TextDecoder();

async function startPiped(): Promise<void> {
  const resp = await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'p1', argv: ['agent', '--input-format', 'stream-json'], stdin: 'pipe' } }));
  expect(resp.status).toBe(200);
  // What the holder does once it holds the FIFO open.
  fakeFor('s1').files.set(sp.ready, new Uint8Array());
}

function write(data: string, off: number | string | null): Promise<Response> {
  const q = off === null ? '' : `?off=${off}`;
  return call(b, req('POST', `/v1/sb/s1/proc/p1/stdin${q}`, { rawBody: data, headers: { 'Content-Type': 'application/octet-stream' } }));
}

function piped(): string {
  const f = fakeFor('s1').files.get(sp.fifo);
  return f ? dec.decode(f) : '';
}

describe('POST /v1/sb/:id/proc with stdin "pipe"', () => {
  it('starts the process reading a FIFO and a holder keeping its write end open', async () => {
    await startPiped();
    const sb = fakeFor('s1');
    expect(sb.startProcess).toHaveBeenCalledTimes(2);
    const [hcmd, hopts] = sb.startProcess.mock.calls[0]!;
    expect(hcmd).toBe(holderCommand(sp));
    expect(hopts).toMatchObject({ processId: holderId('p1') });
    expect(sb.exec).toHaveBeenCalledWith(ensureFifo(sp));
    expect(sb.dirs.has(sp.dir)).toBe(true);
    expect(sb.files.has(sp.fifo)).toBe(true);
    const [cmd, opts] = sb.startProcess.mock.calls[1]!;
    expect(cmd).toBe(`${ensureFifo(sp)} && ${buildCommand({ argv: ['agent', '--input-format', 'stream-json'], stdinPath: sp.fifo })}`);
    expect(cmd).toContain(`< '/tmp/fleet-stdin/p1/fifo'`);
    expect(opts).toMatchObject({ processId: 'p1', autoCleanup: false });
  });

  it('is idempotent: a retried start starts neither the holder nor the process again', async () => {
    await startPiped();
    await startPiped();
    expect(fakeFor('s1').startProcess).toHaveBeenCalledTimes(2);
  });

  it('refuses stdin together with stdin_path, and unknown stdin modes', async () => {
    for (const body of [
      { proc_id: 'p1', argv: ['a'], stdin: 'pipe', stdin_path: 'x' },
      { proc_id: 'p1', argv: ['a'], stdin: 'tty' },
    ]) {
      const resp = await call(b, req('POST', '/v1/sb/s1/proc', { body }));
      expect(resp.status).toBe(400);
      expect((await json(resp)).code).toBe('invalid_stdin');
    }
    expect(fakeFor('s1').startProcess).not.toHaveBeenCalled();
  });
});

describe('POST /v1/sb/:id/proc/:proc_id/stdin', () => {
  it('appends writes in order and answers the applied offset', async () => {
    await startPiped();
    let r = await write('{"type":"user"}\n', 0);
    expect(r.status).toBe(200);
    expect(await json(r)).toEqual({ off: 16 });
    r = await write('second\n', 16);
    expect(await json(r)).toEqual({ off: 23 });
    expect(piped()).toBe('{"type":"user"}\nsecond\n');
  });

  it('applies a retried write once, and only the new tail of an overlapping one', async () => {
    await startPiped();
    await write('one\n', 0);
    const again = await write('one\n', 0);
    expect(again.status).toBe(200);
    expect(await json(again)).toEqual({ off: 4 });
    expect(piped()).toBe('one\n');
    const overlap = await write('ne\ntwo\n', 1);
    expect(await json(overlap)).toEqual({ off: 8 });
    expect(piped()).toBe('one\ntwo\n');
  });

  it('refuses a write past the applied end with 409 stdin_gap and the applied offset', async () => {
    await startPiped();
    await write('one\n', 0);
    const r = await write('three\n', 10);
    expect(r.status).toBe(409);
    expect(await json(r)).toMatchObject({ code: 'stdin_gap', off: 4 });
    expect(piped()).toBe('one\n');
  });

  it('answers 503 when the append fails and applies the retry exactly once', async () => {
    await startPiped();
    const sb = fakeFor('s1');
    sb.execFailures.push(124);
    const r = await write('x\n', 0);
    expect(r.status).toBe(503);
    expect((await json(r)).code).toBe('stdin_write_failed');
    expect(piped()).toBe('');
    const retry = await write('x\n', 0);
    expect(await json(retry)).toEqual({ off: 2 });
    expect(piped()).toBe('x\n');
  });

  it('waits for the holder: a write before it holds the FIFO fails with 503 and is not applied', async () => {
    await startPiped();
    fakeFor('s1').files.delete(sp.ready);
    const r = await write('early\n', 0);
    expect(r.status).toBe(503);
    expect(piped()).toBe('');
    fakeFor('s1').files.set(sp.ready, new Uint8Array());
    expect(await json(await write('early\n', 0))).toEqual({ off: 6 });
    expect(piped()).toBe('early\n');
  });

  it('answers 409 proc_exited after the process exited, yet a retry of an applied write still succeeds', async () => {
    await startPiped();
    await write('a\n', 0);
    fakeFor('s1').procs.get('p1')!.status = 'completed';
    const retry = await write('a\n', 0);
    expect(retry.status).toBe(200);
    const r = await write('b\n', 2);
    expect(r.status).toBe(409);
    expect((await json(r)).code).toBe('proc_exited');
  });

  it('rejects a missing or malformed offset, a too large body, unknown and non-interactive processes', async () => {
    await startPiped();
    for (const off of [null, '-1', 'x', '1.5']) {
      const r = await write('a', off);
      expect(r.status).toBe(400);
      expect((await json(r)).code).toBe('invalid_offset');
    }
    const big = await write('x'.repeat(MAX_STDIN_WRITE + 1), 0);
    expect(big.status).toBe(413);
    const unknown = await call(b, req('POST', '/v1/sb/s1/proc/nope/stdin?off=0', { rawBody: 'a' }));
    expect(unknown.status).toBe(404);
    expect((await json(unknown)).code).toBe('proc_not_found');
    await call(b, req('POST', '/v1/sb/s1/proc', { body: { proc_id: 'plain', argv: ['true'] } }));
    const plain = await call(b, req('POST', '/v1/sb/s1/proc/plain/stdin?off=0', { rawBody: 'a' }));
    expect(plain.status).toBe(409);
    expect((await json(plain)).code).toBe('not_interactive');
    expect(piped()).toBe('');
  });

  it('allows only POST', async () => {
    await startPiped();
    const r = await call(b, req('GET', '/v1/sb/s1/proc/p1/stdin'));
    expect(r.status).toBe(405);
  });
});

describe('POST /v1/sb/:id/proc/:proc_id/stdin/close', () => {
  it('kills the holder (EOF for the process), is idempotent, and later writes get 409 stdin_closed', async () => {
    await startPiped();
    await write('a\n', 0);
    const sb = fakeFor('s1');
    let r = await call(b, req('POST', '/v1/sb/s1/proc/p1/stdin/close'));
    expect(r.status).toBe(200);
    expect(await json(r)).toEqual({ closed: true });
    expect(sb.killProcess).toHaveBeenCalledWith(holderId('p1'), 'SIGKILL');
    expect(sb.procs.get(holderId('p1'))!.status).toBe('killed');
    r = await call(b, req('POST', '/v1/sb/s1/proc/p1/stdin/close'));
    expect(r.status).toBe(200);
    expect(sb.killProcess).toHaveBeenCalledTimes(1);
    const late = await write('b\n', 2);
    expect(late.status).toBe(409);
    expect((await json(late)).code).toBe('stdin_closed');
    // A retry of the write applied before the close still succeeds.
    expect((await write('a\n', 0)).status).toBe(200);
    expect(piped()).toBe('a\n');
  });
});

describe('planWrite', () => {
  it('classifies writes against the applied offset', () => {
    expect(planWrite(0, 3, 0)).toEqual({ kind: 'append', skip: 0, end: 3 });
    expect(planWrite(0, 3, 3)).toEqual({ kind: 'duplicate' });
    expect(planWrite(0, 0, 0)).toEqual({ kind: 'duplicate' });
    expect(planWrite(1, 5, 3)).toEqual({ kind: 'append', skip: 2, end: 6 });
    expect(planWrite(4, 1, 3)).toEqual({ kind: 'gap' });
  });
});

// The commands run by a real POSIX sh: holder and process meet at the FIFO,
// appends arrive as lines while stdin stays open, killing the holder is EOF.
describe('the FIFO commands in a real shell', () => {
  it('deliver each append to the running process and EOF when the holder dies', () => {
    const procId = `t-${crypto.randomUUID()}`;
    const p = stdinPaths(procId);
    const out = `${p.dir}.out`;
    const agent = buildCommand({ argv: ['sh', '-c', 'while read -r l; do echo "got $l"; done; echo bye'], stdinPath: p.fifo });
    const script = [
      ensureFifo(p), // as the bridge does before starting the holder
      `sh -c ${shellQuote(holderCommand(p))} & hp=$!`,
      `sh -c ${shellQuote(`${ensureFifo(p)} && ${agent}`)} > ${shellQuote(out)} & pp=$!`,
      `printf 'first\\n' > ${shellQuote(p.chunk)} && ${appendCommand(p, 6)}`,
      `printf 'second\\n' > ${shellQuote(p.chunk)} && ${appendCommand(p, 13)}`,
      'kill $hp',
      'wait $pp',
      `cat ${shellQuote(out)}; printf '|'; cat ${shellQuote(p.off)}`,
      `rm -rf ${shellQuote(p.dir)} ${shellQuote(out)}`,
    ].join('\n');
    const r = spawnSync('sh', ['-c', script], { encoding: 'utf8' });
    expect({ err: r.stderr, out: r.stdout }).toEqual({ err: '', out: 'got first\ngot second\nbye\n|13' });
    expect(r.stdout).toBe('got first\ngot second\nbye\n|13');
  });
});
