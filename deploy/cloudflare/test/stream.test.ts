import { beforeEach, describe, expect, it, vi } from 'vitest';

vi.mock('@cloudflare/sandbox', async () => (await import('./fake-sdk')).sdkModule);

import { MAX_OUT_BYTES, OffsetTracker, exitStatusOf } from '../src/stream';
import { fakeFor, FakeSdkError, resetFakes, type LogFeed } from './fake-sdk';
import { bridge, call, FakeCtx, json, makeEnv, outOf, req, SSEReader, type SSEItem } from './helpers';

beforeEach(() => resetFakes());

const b = bridge();
const enc = new TextEncoder();

function dataOf(item: SSEItem | null): Record<string, unknown> {
  return JSON.parse(item?.data ?? 'null') as Record<string, unknown>;
}

/** A running process p1 in sandbox s1 whose log stream is scripted by `script`. */
function proc(script: (feed: LogFeed) => void, status = 'running') {
  const sb = fakeFor('s1');
  sb.addProc({ id: 'p1', status });
  sb.onStream = (feed) => script(feed);
  return sb;
}

async function open(query = '', init: { signal?: AbortSignal; headers?: Record<string, string> } = {}, ctx = new FakeCtx(), bb = b) {
  const resp = await call(bb, req('GET', `/v1/sb/s1/proc/p1/stream${query}`, init), makeEnv(), ctx);
  return { resp, ctx };
}

describe('stream: events', () => {
  it('re-serves stdout/stderr as out events with per-fd offsets, then exit', async () => {
    const sb = proc((f) => {
      f.frame({ type: 'process_info', processId: 'p1', command: 'x', status: 'running' });
      f.stdout('hello').stderr('oops').stdout(' world');
      sb.procs.get('p1')!.status = 'completed';
      sb.procs.get('p1')!.exitCode = 0;
      f.exit('completed', 0);
      f.close();
    });
    const { resp } = await open();
    expect(resp.status).toBe(200);
    expect(resp.headers.get('Content-Type')).toMatch(/^text\/event-stream/);
    expect(resp.headers.get('Cache-Control')).toBe('no-cache, no-transform');
    const events = await new SSEReader(resp).rest();
    expect(events.map((e) => e.event)).toEqual(['out', 'out', 'out', 'exit']);
    expect(events.slice(0, 3).map(outOf).map(({ fd, off, text }) => ({ fd, off, text }))).toEqual([
      { fd: 1, off: 0, text: 'hello' },
      { fd: 2, off: 0, text: 'oops' },
      { fd: 1, off: 5, text: ' world' },
    ]);
    expect(events.slice(0, 3).map((e) => e.id)).toEqual(['5,0', '5,4', '11,4']);
    expect(dataOf(events[3]!)).toEqual({ code: 0, status: 'completed' });
  });

  it('parses SDK frames that carry an event: line (RPC transport) and split across reads', async () => {
    proc((f) => {
      f.frame({ type: 'stdout', data: 'a' }, true);
      f.raw('data: {"type":"std').raw('out","data":"bc"}\r\n\r\n');
      f.raw(': comment\n\ndata: [DONE]\n\ndata: not json\n\n');
      f.exit('completed', 0);
      f.close();
    });
    const events = await new SSEReader((await open()).resp).rest();
    expect(events.filter((e) => e.event === 'out').map((e) => outOf(e).text).join('')).toBe('abc');
    expect(events.at(-1)?.event).toBe('exit');
  });

  it('reports failed with the exit code, killed from the process record, error as failed, missing code as -1', async () => {
    const cases: Array<[string, number | undefined, string, number | undefined, { code: number; status: string }]> = [
      // frame status, frame code, record status, record code, expected
      ['failed', 2, 'failed', 2, { code: 2, status: 'failed' }],
      ['failed', 143, 'killed', 143, { code: 143, status: 'killed' }],
      ['killed', undefined, 'killed', undefined, { code: -1, status: 'killed' }],
      ['error', undefined, 'error', undefined, { code: -1, status: 'failed' }],
      ['completed', 0, 'completed', 0, { code: 0, status: 'completed' }],
    ];
    for (const [fs, fc, rs, rc, want] of cases) {
      resetFakes();
      const sb = proc((f) => {
        const p = sb.procs.get('p1')!;
        p.status = rs;
        if (rc !== undefined) p.exitCode = rc;
        f.exit(fs, fc);
        f.close();
      });
      const events = await new SSEReader((await open()).resp).rest();
      expect(events.map((e) => e.event), fs).toEqual(['exit']);
      expect(dataOf(events[0]!), `${fs}/${rs}`).toEqual(want);
    }
  });

  it('falls back to the exit frame when the process record cannot be read', async () => {
    const sb = proc((f) => {
      f.exit('failed', 7);
      f.close();
    });
    sb.getProcess.mockRejectedValue(new Error('container gone'));
    const events = await new SSEReader((await open()).resp).rest();
    expect(dataOf(events[0]!)).toEqual({ code: 7, status: 'failed' });
  });

  it('sends an error event (never exit) when the SDK stream ends without an exit frame', async () => {
    proc((f) => {
      f.stdout('partial');
      f.close();
    });
    const events = await new SSEReader((await open()).resp).rest();
    expect(events.map((e) => e.event)).toEqual(['out', 'error']);
    expect(dataOf(events[1]!)).toMatchObject({ code: 'upstream_closed' });
    expect(String(dataOf(events[1]!).message)).toContain('from=7,0');
  });

  it('sends an error event for an SDK error frame and for a failing SDK stream', async () => {
    proc((f) => {
      f.frame({ type: 'error', error: 'session died' });
    });
    let events = await new SSEReader((await open()).resp).rest();
    expect(events.map((e) => e.event)).toEqual(['error']);
    expect(dataOf(events[0]!)).toEqual({ code: 'upstream_error', message: 'session died' });

    resetFakes();
    const sb = proc((f) => {
      f.stdout('x');
    });
    const r = new SSEReader((await open()).resp);
    expect((await r.nextEvent())?.event).toBe('out');
    sb.feeds[0]!.fail(new FakeSdkError('CONTAINER_UNAVAILABLE', 'container restarted', 503));
    events = await r.rest();
    expect(events.map((e) => e.event)).toEqual(['error']);
    expect(dataOf(events[0]!)).toEqual({ code: 'container_unavailable', message: 'container restarted' });
  });

  it('answers 404 JSON (not SSE) for an unknown process', async () => {
    const resp = await call(b, req('GET', '/v1/sb/s1/proc/ghost/stream'));
    expect(resp.status).toBe(404);
    expect((await json(resp)).code).toBe('proc_not_found');
  });

  it('cuts chunks larger than MAX_OUT_BYTES into consecutive out events', async () => {
    const big = 'x'.repeat(MAX_OUT_BYTES * 2 + 100);
    proc((f) => {
      f.stdout(big).exit('completed', 0);
      f.close();
    });
    const events = await new SSEReader((await open()).resp).rest();
    const outs = events.filter((e) => e.event === 'out').map(outOf);
    expect(outs.map((o) => [o.off, o.bytes.length])).toEqual([
      [0, MAX_OUT_BYTES],
      [MAX_OUT_BYTES, MAX_OUT_BYTES],
      [2 * MAX_OUT_BYTES, 100],
    ]);
    expect(outs.map((o) => o.text).join('')).toBe(big);
  });

  it('sends : ping comments while the process is quiet', async () => {
    proc(() => {});
    const { resp } = await open('', {}, new FakeCtx(), bridge({ pingMs: 5 }));
    const r = new SSEReader(resp);
    const first = await r.next();
    expect(first).toEqual({ comment: 'ping' });
    await r.cancel();
  });
});

describe('stream: resume with from=', () => {
  // Every attach replays the whole output first, as the SDK does.
  const replay = (f: LogFeed) => {
    f.stdout('hello').stderr('ERR').stdout(' world').exit('completed', 0);
    f.close();
  };

  async function outsFor(query: string, init: { headers?: Record<string, string> } = {}) {
    const sb = proc(replay);
    sb.procs.get('p1')!.status = 'completed';
    sb.procs.get('p1')!.exitCode = 0;
    const events = await new SSEReader((await open(query, init)).resp).rest();
    return { events, outs: events.filter((e) => e.event === 'out').map(outOf).map(({ fd, off, text }) => ({ fd, off, text })) };
  }

  it('skips already delivered bytes per fd, splitting a chunk that straddles the offset', async () => {
    const { outs, events } = await outsFor('?from=3,1');
    expect(outs).toEqual([
      { fd: 1, off: 3, text: 'lo' },
      { fd: 2, off: 1, text: 'RR' },
      { fd: 1, off: 5, text: ' world' },
    ]);
    expect(events.at(-1)?.event).toBe('exit');
  });

  it('drops whole chunks below the offset', async () => {
    expect((await outsFor('?from=7,3')).outs).toEqual([{ fd: 1, off: 7, text: 'orld' }]);
    resetFakes();
    expect((await outsFor('?from=11,3')).outs).toEqual([]);
  });

  it('a single number resumes stdout only', async () => {
    expect((await outsFor('?from=5')).outs).toEqual([
      { fd: 2, off: 0, text: 'ERR' },
      { fd: 1, off: 5, text: ' world' },
    ]);
  });

  it('accepts Last-Event-ID (the id of the last event received) when from is absent', async () => {
    expect((await outsFor('', { headers: { 'Last-Event-ID': '5,3' } })).outs).toEqual([{ fd: 1, off: 5, text: ' world' }]);
  });

  it('splits inside a multi-byte character at the byte level', async () => {
    const sb = proc((f) => {
      f.stdout('héllo ✓').exit('completed', 0);
      f.close();
    });
    sb.procs.get('p1')!.status = 'completed';
    const events = await new SSEReader((await open('?from=2,0')).resp).rest();
    const out = outOf(events[0]!);
    expect(out.off).toBe(2);
    expect(out.bytes).toEqual(enc.encode('héllo ✓').subarray(2));
  });

  it('reports offset_out_of_range instead of exit when from lies beyond the output', async () => {
    const { events, outs } = await outsFor('?from=99,0');
    expect(outs).toEqual([{ fd: 2, off: 0, text: 'ERR' }]);
    expect(events.map((e) => e.event)).toEqual(['out', 'error']);
    expect(dataOf(events[1]!)).toMatchObject({ code: 'offset_out_of_range' });
  });

  it('rejects a malformed from with 400', async () => {
    proc(replay);
    for (const q of ['?from=a,b', '?from=-1,0', '?from=1,2,3', '?from=1.5']) {
      const resp = (await open(q)).resp;
      expect(resp.status, q).toBe(400);
      expect((await json(resp)).code).toBe('invalid_from');
    }
  });

  it('OffsetTracker: exact arithmetic', () => {
    const t = new OffsetTracker([4, 0], 3);
    expect(t.take(1, enc.encode('ab'))).toEqual([]);
    const p = t.take(1, enc.encode('cdefghi'));
    expect(p.map((x) => [x.off, new TextDecoder().decode(x.bytes)])).toEqual([
      [4, 'efg'],
      [7, 'hi'],
    ]);
    expect(t.id()).toBe('9,0');
    expect(t.overrun()).toEqual([]);
    expect(exitStatusOf(undefined, 0)).toBe('completed');
    expect(exitStatusOf(undefined, 1)).toBe('failed');
  });
});

describe('stream: kill on disconnect', () => {
  it('kills the process through waitUntil when the client disconnects with kill_on_disconnect=1', async () => {
    const sb = proc((f) => {
      f.stdout('working');
    });
    const ac = new AbortController();
    const { resp, ctx } = await open('?kill_on_disconnect=1', { signal: ac.signal });
    const r = new SSEReader(resp);
    expect((await r.nextEvent())?.event).toBe('out');
    expect(sb.killProcess).not.toHaveBeenCalled();
    ac.abort();
    expect(sb.killProcess).toHaveBeenCalledTimes(1);
    expect(sb.killProcess).toHaveBeenCalledWith('p1');
    expect(ctx.promises).toHaveLength(1);
    await Promise.all(ctx.promises);
    expect(sb.procs.get('p1')?.status).toBe('killed');
    // The upstream log stream is released too.
    await vi.waitFor(() => expect(sb.feeds[0]?.cancelled).toBe(true));
  });

  it('kills when the response body is cancelled (the other face of a disconnect)', async () => {
    const sb = proc((f) => {
      f.stdout('a');
    });
    const { resp } = await open('?kill_on_disconnect=1');
    const r = new SSEReader(resp);
    await r.nextEvent();
    await r.cancel();
    // The next write into the cancelled body notices the disconnect.
    sb.feeds[0]!.stdout('b');
    await vi.waitFor(() => expect(sb.killProcess).toHaveBeenCalledWith('p1'));
  });

  it('only detaches (no kill) without kill_on_disconnect', async () => {
    const sb = proc((f) => {
      f.stdout('working');
    });
    const ac = new AbortController();
    const { resp, ctx } = await open('', { signal: ac.signal });
    await new SSEReader(resp).nextEvent();
    ac.abort();
    await vi.waitFor(() => expect(sb.feeds[0]?.cancelled).toBe(true));
    expect(sb.killProcess).not.toHaveBeenCalled();
    expect(ctx.promises).toHaveLength(0);
  });

  it('does not kill after the exit event was delivered', async () => {
    const sb = proc((f) => {
      f.exit('completed', 0);
      f.close();
    });
    sb.procs.get('p1')!.status = 'completed';
    const ac = new AbortController();
    const { resp } = await open('?kill_on_disconnect=1', { signal: ac.signal });
    const events = await new SSEReader(resp).rest();
    expect(events.map((e) => e.event)).toEqual(['exit']);
    ac.abort();
    expect(sb.killProcess).not.toHaveBeenCalled();
  });
});
