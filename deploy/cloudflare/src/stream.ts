// GET /v1/sb/:id/proc/:proc_id/stream: re-serving the SDK's process logs as
// our SSE protocol (README.md, "Stream").
//
// The SDK's streamProcessLogs replays everything the process has written so
// far on every attach, then follows live output, then sends an `exit` frame.
// We count bytes per fd from the start of that replay, drop what the client
// already has (`from`), split a chunk that straddles the offset, and cut
// large chunks into pieces of at most MAX_OUT_BYTES. Output is text-decoded
// by the container before it reaches us (the SDK's data is a string), so
// offsets count the UTF-8 bytes of that text.

import { formatEvent, parseSSE, PING, toBase64, type UpstreamEvent } from './sse';
import { fromSdkError } from './errors';

/** Largest raw chunk carried by one `out` event (its base64 is 4/3 of this). */
export const MAX_OUT_BYTES = 48 * 1024;

/** Default interval of `: ping` comments. */
export const DEFAULT_PING_MS = 15_000;

/** What the stream needs from a sandbox (a subset of the SDK's Sandbox). */
export interface StreamSandbox {
  streamProcessLogs(processId: string, options?: { signal?: AbortSignal }): Promise<ReadableStream<Uint8Array>>;
  getProcess(id: string): Promise<{ status: string; exitCode?: number | undefined } | null>;
  killProcess(id: string, signal?: string): Promise<void>;
}

export interface StreamOptions {
  sandbox: StreamSandbox;
  procId: string;
  /** Bytes of stdout and stderr the client already has. */
  from: [number, number];
  /** Kill the process when the client goes away before `exit`. */
  killOnDisconnect: boolean;
  /** The incoming request's signal (aborts on client disconnect with enable_request_signal). */
  signal: AbortSignal;
  waitUntil: (p: Promise<unknown>) => void;
  pingMs?: number;
}

export type ExitStatus = 'completed' | 'failed' | 'killed';

const TERMINAL = new Set(['completed', 'failed', 'killed', 'error']);

/** Maps an SDK process status (and exit code) to the protocol's exit status. */
export function exitStatusOf(status: string | undefined, code: number | undefined): ExitStatus {
  switch (status) {
    case 'completed':
      return 'completed';
    case 'killed':
      return 'killed';
    case 'failed':
    case 'error':
      return 'failed';
    default:
      return code === 0 ? 'completed' : 'failed';
  }
}

/** Piece of output to send: fd, offset of its first byte, bytes. */
export interface OutPiece {
  fd: 1 | 2;
  off: number;
  bytes: Uint8Array;
}

/**
 * Tracks per-fd byte positions of the upstream replay and decides what part
 * of each chunk the client still needs.
 */
export class OffsetTracker {
  /** Bytes seen upstream so far, per fd (index 0 = stdout, 1 = stderr). */
  readonly seen: [number, number] = [0, 0];
  /** Bytes the client has, per fd (advances as pieces are produced). */
  readonly delivered: [number, number];

  constructor(from: [number, number], private readonly maxPiece = MAX_OUT_BYTES) {
    this.delivered = [from[0], from[1]];
  }

  /** Accounts a chunk of fd's output and returns the pieces to send. */
  take(fd: 1 | 2, bytes: Uint8Array): OutPiece[] {
    const i = fd - 1;
    const start = this.seen[i] ?? 0;
    const end = start + bytes.length;
    this.seen[i] = end;
    const have = this.delivered[i] ?? 0;
    if (end <= have) return [];
    const skip = Math.max(0, have - start);
    const pieces: OutPiece[] = [];
    for (let p = skip; p < bytes.length; p += this.maxPiece) {
      pieces.push({ fd, off: start + p, bytes: bytes.subarray(p, Math.min(bytes.length, p + this.maxPiece)) });
    }
    this.delivered[i] = end;
    return pieces;
  }

  /** The fds whose resume offset lies beyond all the output that exists. */
  overrun(): number[] {
    const out: number[] = [];
    if ((this.delivered[0] ?? 0) > this.seen[0]) out.push(1);
    if ((this.delivered[1] ?? 0) > this.seen[1]) out.push(2);
    return out;
  }

  /** Event id: the delivered offsets "stdout,stderr" (usable as Last-Event-ID / from). */
  id(): string {
    return `${this.delivered[0]},${this.delivered[1]}`;
  }
}

const encoder = new TextEncoder();

/**
 * Opens the upstream log stream (errors before the first byte are thrown, so
 * the caller can answer with a plain JSON error) and returns the SSE response.
 */
export async function openProcessStream(opts: StreamOptions): Promise<Response> {
  const upstreamAbort = new AbortController();
  const upstream = await opts.sandbox.streamProcessLogs(opts.procId);

  const { readable, writable } = new TransformStream<Uint8Array, Uint8Array>();
  const writer = writable.getWriter();
  const tracker = new OffsetTracker(opts.from);
  let done = false;

  const cleanup = (): void => {
    done = true;
    clearInterval(pinger);
    opts.signal.removeEventListener('abort', onDisconnect);
    upstreamAbort.abort();
  };

  // Client went away (request signal, or a write into the cancelled body).
  function onDisconnect(): void {
    if (done) return;
    cleanup();
    if (opts.killOnDisconnect) {
      opts.waitUntil(opts.sandbox.killProcess(opts.procId).catch(() => {}));
    }
    writer.abort().catch(() => {});
  }

  const write = async (text: string): Promise<void> => {
    if (done) return;
    try {
      await writer.write(encoder.encode(text));
    } catch {
      onDisconnect();
    }
  };

  // Sends the final event and closes the stream.
  const finish = async (text: string): Promise<void> => {
    if (done) return;
    await write(text);
    if (done) return;
    cleanup();
    await writer.close().catch(() => {});
  };

  const pinger = setInterval(() => {
    void write(PING);
  }, opts.pingMs ?? DEFAULT_PING_MS);

  opts.signal.addEventListener('abort', onDisconnect);
  if (opts.signal.aborted) onDisconnect();

  const resolveExit = async (ev: UpstreamEvent): Promise<{ code: number; status: ExitStatus }> => {
    let code = typeof ev.exitCode === 'number' ? ev.exitCode : undefined;
    const m = typeof ev.data === 'string' ? /^Process (\w+) with exit code/.exec(ev.data) : null;
    const frameStatus = m?.[1];
    let status = frameStatus;
    // The process record is authoritative (a kill is recorded after the exit
    // frame may already say "failed"); the frame is the fallback.
    try {
      const p = await opts.sandbox.getProcess(opts.procId);
      if (p && TERMINAL.has(p.status)) {
        status = frameStatus === 'killed' ? 'killed' : p.status;
        if (typeof p.exitCode === 'number') code = code ?? p.exitCode;
      }
    } catch {
      // keep the frame's view
    }
    return { code: code ?? -1, status: exitStatusOf(status, code) };
  };

  const pump = async (): Promise<void> => {
    try {
      for await (const ev of parseSSE(upstream, upstreamAbort.signal)) {
        if (done) return;
        if (ev.type === 'stdout' || ev.type === 'stderr') {
          if (typeof ev.data !== 'string' || ev.data === '') continue;
          const fd = ev.type === 'stdout' ? 1 : 2;
          for (const piece of tracker.take(fd, encoder.encode(ev.data))) {
            await write(formatEvent('out', { fd: piece.fd, off: piece.off, b64: toBase64(piece.bytes) }, tracker.id()));
            if (done) return;
          }
        } else if (ev.type === 'exit') {
          const overrun = tracker.overrun();
          if (overrun.length > 0) {
            await finish(formatEvent('error', {
              code: 'offset_out_of_range',
              message: `from offset beyond the output of fd ${overrun.join(',')} (stdout ${tracker.seen[0]} bytes, stderr ${tracker.seen[1]} bytes)`,
            }));
            return;
          }
          await finish(formatEvent('exit', await resolveExit(ev)));
          return;
        } else if (ev.type === 'error') {
          const msg = typeof ev.error === 'string' ? ev.error : typeof ev.data === 'string' ? ev.data : 'process log stream error';
          await finish(formatEvent('error', { code: 'upstream_error', message: msg }));
          return;
        }
        // process_info, start and unknown frames carry nothing for the client.
      }
      if (done) return;
      // The SDK stream ended without an exit frame: a transport failure. Never
      // synthesise an exit here (output may be missing); the client reconnects.
      await finish(formatEvent('error', { code: 'upstream_closed', message: 'process log stream ended without an exit event; reconnect with from=' + tracker.id() }));
    } catch (err) {
      if (done) return;
      const e = fromSdkError(err);
      await finish(formatEvent('error', { code: e.code, message: e.message }));
    }
  };
  void pump();

  return new Response(readable, {
    status: 200,
    headers: {
      'Content-Type': 'text/event-stream; charset=utf-8',
      'Cache-Control': 'no-cache, no-transform',
      'X-Accel-Buffering': 'no',
    },
  });
}
