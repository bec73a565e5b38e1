// Interactive stdin of a process (README "Interactive stdin").
//
// SDK 0.12.10 has no call that writes to a running process's stdin
// (startProcess takes a command line; exec runs a new command), so the bridge
// gives an interactive process a named pipe in the container:
//
//   /tmp/fleet-stdin/<proc_id>/fifo   the process's stdin (`… < fifo`)
//   /tmp/fleet-stdin/<proc_id>/off    bytes applied so far (decimal)
//   /tmp/fleet-stdin/<proc_id>/chunk  the bytes of the write in progress
//   /tmp/fleet-stdin/<proc_id>/closed present once stdin was closed
//   /tmp/fleet-stdin/<proc_id>/ready  present once the holder holds the FIFO
//                                     open (and so the process reads it)
//
// A holder process `<proc_id>--stdin` keeps a writer open on the FIFO, so the
// process does not see EOF between writes; closing stdin kills the holder.
// Each write carries the client's byte offset: a retried write is applied
// once, a write past the applied end is refused (409 stdin_gap).

import { HttpError, invalid } from './errors';
import { shellQuote } from './shell';

/** Where the bridge keeps the stdin pipe of an interactive process. */
export const STDIN_ROOT = '/tmp/fleet-stdin';

/** Largest body of one stdin write (a pipe's capacity on Linux). */
export const MAX_STDIN_WRITE = 64 * 1024;

/** How long one write may wait for the process to read, in seconds. */
export const STDIN_WRITE_TIMEOUT_S = 60;

export interface StdinPaths {
  dir: string;
  fifo: string;
  off: string;
  chunk: string;
  closed: string;
  ready: string;
}

export function stdinPaths(procId: string): StdinPaths {
  const dir = `${STDIN_ROOT}/${procId}`;
  return { dir, fifo: `${dir}/fifo`, off: `${dir}/off`, chunk: `${dir}/chunk`, closed: `${dir}/closed`, ready: `${dir}/ready` };
}

/** The process id of the holder that keeps the FIFO's write end open. */
export function holderId(procId: string): string {
  return `${procId}--stdin`;
}

/** Shell prefix that makes the FIFO exist (safe when two processes race). */
export function ensureFifo(p: StdinPaths): string {
  return `mkdir -p ${shellQuote(p.dir)} && { mkfifo ${shellQuote(p.fifo)} 2>/dev/null; [ -p ${shellQuote(p.fifo)} ]; }`;
}

/**
 * Command of the holder: opens the FIFO for writing (which waits for the
 * process to open it for reading), marks `ready`, and sleeps holding it.
 * Writes wait for `ready`: a write that came first would be the only writer,
 * and its close would be EOF for the process.
 */
export function holderCommand(p: StdinPaths): string {
  return `${ensureFifo(p)} && { : > ${shellQuote(p.ready)}; exec sleep 2147483647; } > ${shellQuote(p.fifo)}`;
}

/**
 * Command that appends the staged chunk to the FIFO and records the new
 * offset. dd opens the FIFO itself, so `timeout` also bounds the open (which
 * blocks when the process has gone and nobody reads); nocreat keeps it from
 * ever creating a regular file where the FIFO should be.
 */
export function appendCommand(p: StdinPaths, newOff: number): string {
  return (
    `timeout ${STDIN_WRITE_TIMEOUT_S} sh -c 'until [ -e "$1" ]; do sleep 0.05; done' sh ${shellQuote(p.ready)}` +
    ` && timeout ${STDIN_WRITE_TIMEOUT_S} dd if=${shellQuote(p.chunk)} of=${shellQuote(p.fifo)} oflag=append conv=notrunc,nocreat status=none` +
    ` && printf '%s' ${shellQuote(String(newOff))} > ${shellQuote(p.off)}`
  );
}

/** Parses `?off=N`, the client's byte offset of the body in the stdin stream. */
export function parseStdinOffset(raw: string | null): number {
  if (raw === null || !/^[0-9]{1,15}$/.test(raw)) throw invalid('invalid_offset', 'off must be a non-negative integer: the byte offset of the body in the stdin stream');
  return Number(raw);
}

/** Parses the content of the `off` file (absent: 0). */
export function parseAppliedOffset(text: string | null): number {
  if (text === null || text.trim() === '') return 0;
  const n = Number(text.trim());
  if (!Number.isSafeInteger(n) || n < 0) throw new HttpError(502, 'stdin_state_corrupt', 'the recorded stdin offset is not a number');
  return n;
}

export type WritePlan = { kind: 'duplicate' } | { kind: 'gap' } | { kind: 'append'; skip: number; end: number };

/**
 * Decides what to do with a write of `len` bytes at client offset `off` when
 * `applied` bytes are already in the pipe: skip what was applied (a retry),
 * refuse a gap, append the rest.
 */
export function planWrite(off: number, len: number, applied: number): WritePlan {
  const end = off + len;
  if (off > applied) return { kind: 'gap' };
  if (end <= applied) return { kind: 'duplicate' };
  return { kind: 'append', skip: applied - off, end };
}
