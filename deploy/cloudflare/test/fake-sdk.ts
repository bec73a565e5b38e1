// A scripted stand-in for @cloudflare/sandbox, installed in each test file with
//   vi.mock('@cloudflare/sandbox', async () => (await import('./fake-sdk')).sdkModule);
// It keeps sandboxes, processes and files in memory and lets tests drive the
// process-log stream frame by frame (LogFeed).

import { vi } from 'vitest';

import type { ModelEvent } from '../src/model-gateway';
import { RunStore, type KeyValueStorage, type RunMeta } from '../src/model-ledger';

const encoder = new TextEncoder();

/** An error shaped like the SDK's SandboxError (code + httpStatus). */
export class FakeSdkError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly httpStatus: number,
  ) {
    super(message);
  }
}

export interface FakeProc {
  id: string;
  pid: number;
  command: string;
  status: string;
  exitCode?: number;
  env?: Record<string, string> | undefined;
  cwd?: string | undefined;
}

/** A process-log stream the test writes SDK frames into. */
export class LogFeed {
  readonly stream: ReadableStream<Uint8Array>;
  cancelled = false;
  private controller!: ReadableStreamDefaultController<Uint8Array>;

  constructor() {
    this.stream = new ReadableStream<Uint8Array>({
      start: (c) => {
        this.controller = c;
      },
      cancel: () => {
        this.cancelled = true;
      },
    });
  }

  /** Sends one SDK frame `data: <json>\n\n` (optionally with an event: line, as the RPC transport does). */
  frame(obj: Record<string, unknown>, withEventLine = false): this {
    const ev = withEventLine && typeof obj.type === 'string' ? `event: ${obj.type}\n` : '';
    return this.raw(`${ev}data: ${JSON.stringify(obj)}\n\n`);
  }

  stdout(data: string): this {
    return this.frame({ type: 'stdout', data, processId: 'p', timestamp: 't' });
  }

  stderr(data: string): this {
    return this.frame({ type: 'stderr', data, processId: 'p', timestamp: 't' });
  }

  exit(status: string, exitCode: number | undefined): this {
    return this.frame({ type: 'exit', processId: 'p', exitCode, data: `Process ${status} with exit code ${exitCode}`, timestamp: 't' });
  }

  raw(text: string): this {
    if (!this.cancelled) this.controller.enqueue(encoder.encode(text));
    return this;
  }

  close(): void {
    if (!this.cancelled) this.controller.close();
  }

  fail(err: Error): void {
    if (!this.cancelled) this.controller.error(err);
  }
}

function bytesOf(b64: string): Uint8Array {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** A Map behind the DurableObjectStorage calls RunStore makes (values cloned, as storage does). */
export function memoryStorage(): KeyValueStorage & { map: Map<string, unknown> } {
  const map = new Map<string, unknown>();
  return {
    map,
    async get<T>(k: string) { return structuredClone(map.get(k)) as T | undefined; },
    async put<T>(k: string, v: T) { map.set(k, structuredClone(v)); },
    async delete(k: string) { return map.delete(k); },
  };
}

export class FakeSandbox {
  /** The object's storage, where its model run is kept (the Sandbox class's model* RPC methods, sandbox.ts). */
  readonly storage = memoryStorage();
  private readonly run = new RunStore(this.storage);
  modelOpen = vi.fn(async (max: number | undefined, spent: number, meta: RunMeta) => this.run.open(max, spent, meta));
  modelState = vi.fn(async () => this.run.state());
  modelRecord = vi.fn(async (ev: ModelEvent) => this.run.record(ev));
  modelReport = vi.fn(async (from: number) => this.run.report(from));
  modelClose = vi.fn(async (from: number) => this.run.closeReport(from));

  readonly procs = new Map<string, FakeProc>();
  readonly files = new Map<string, Uint8Array>();
  readonly dirs = new Set<string>();
  readonly envVars: Record<string, string> = {};
  readonly feeds: LogFeed[] = [];
  /** Scripts each new log stream; default: nothing (the test drives the feed). */
  onStream: (feed: LogFeed, proc: FakeProc) => void = () => {};
  /** When set, startProcess throws it (after optionally registering the process). */
  startError: Error | null = null;
  private nextPid = 100;

  constructor(readonly id: string) {}

  addProc(p: Partial<FakeProc> & { id: string }): FakeProc {
    const proc: FakeProc = { pid: this.nextPid++, command: 'true', status: 'running', ...p };
    this.procs.set(p.id, proc);
    return proc;
  }

  startProcess = vi.fn(async (command: string, options?: { processId?: string; env?: Record<string, string>; cwd?: string }) => {
    if (this.startError) throw this.startError;
    const id = options?.processId ?? `proc_${this.nextPid}`;
    if (this.procs.has(id)) throw new FakeSdkError('PROCESS_ERROR', `Process ${id} already exists`, 500);
    return { ...this.addProc({ id, command, env: options?.env, cwd: options?.cwd }) };
  });

  getProcess = vi.fn(async (id: string) => {
    const p = this.procs.get(id);
    return p ? { ...p } : null;
  });

  killProcess = vi.fn(async (id: string, _signal?: string) => {
    const p = this.procs.get(id);
    if (!p) throw new FakeSdkError('PROCESS_NOT_FOUND', `Process ${id} not found`, 404);
    p.status = 'killed';
  });

  streamProcessLogs = vi.fn(async (id: string) => {
    const p = this.procs.get(id);
    if (!p) throw new FakeSdkError('PROCESS_NOT_FOUND', `Process ${id} not found`, 404);
    const feed = new LogFeed();
    this.feeds.push(feed);
    this.onStream(feed, p);
    return feed.stream;
  });

  setEnvVars = vi.fn(async (vars: Record<string, string | undefined>) => {
    for (const [k, v] of Object.entries(vars)) if (v !== undefined) this.envVars[k] = v;
  });

  mkdir = vi.fn(async (path: string, _o?: { recursive?: boolean }) => {
    this.dirs.add(path);
    return { success: true, path };
  });

  writeFile = vi.fn(async (path: string, content: string, options?: { encoding?: string }) => {
    this.files.set(path, options?.encoding === 'base64' ? bytesOf(content) : encoder.encode(content));
    return { success: true, path };
  });

  readFileStream = vi.fn(async (path: string) => {
    const data = this.files.get(path);
    if (!data) throw new FakeSdkError('FILE_NOT_FOUND', `File not found: ${path}`, 404);
    return new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(data);
        c.close();
      },
    });
  });

  /** Exit codes the next exec calls return without running (a failed or timed-out write). */
  execFailures: number[] = [];

  /**
   * Runs the few shell forms the bridge's stdin route uses, on the in-memory
   * files (a FIFO is a file that appends):
   *   timeout N dd if='A' of='B' oflag=append conv=notrunc,nocreat status=none
   *   printf '%s' 'V' > 'C'
   *   timeout N sh -c 'until [ -e "$1" ]; do sleep 0.05; done' sh 'R'
   *   mkdir -p 'D'
   *   { mkfifo 'F' 2>/dev/null; [ -p 'F' ]; }
   * joined by ` && `. Anything else fails with exit 127, so a change of the
   * command is noticed by the tests.
   */
  exec = vi.fn(async (command: string, _o?: { timeout?: number }) => {
    const fail = this.execFailures.shift();
    if (fail !== undefined) return { exitCode: fail, stdout: '', stderr: 'scripted failure', success: false };
    const q = "'((?:[^']|'\\\\'')*)'";
    const unq = (v: string): string => v.replaceAll("'\\''", "'");
    const dd = new RegExp(`^timeout [0-9]+ dd if=${q} of=${q} oflag=append conv=notrunc,nocreat status=none$`);
    const pf = new RegExp(`^printf '%s' ${q} > ${q}$`);
    const md = new RegExp(`^mkdir -p ${q}$`);
    const wr = new RegExp(`^timeout [0-9]+ sh -c 'until \\[ -e "\\$1" \\]; do sleep 0\\.05; done' sh ${q}$`);
    const mf = new RegExp(`^\\{ mkfifo ${q} 2>/dev/null; \\[ -p ${q} \\]; \\}$`);
    for (const part of command.split(' && ')) {
      let m = dd.exec(part);
      if (m) {
        const src = this.files.get(unq(m[1]!));
        if (!src || !this.files.has(unq(m[2]!))) return { exitCode: 1, stdout: '', stderr: 'no such file', success: false };
        const dst = this.files.get(unq(m[2]!)) ?? new Uint8Array();
        const out = new Uint8Array(dst.length + src.length);
        out.set(dst);
        out.set(src, dst.length);
        this.files.set(unq(m[2]!), out);
        continue;
      }
      m = wr.exec(part);
      if (m) {
        // Waiting for a file that never comes: timeout's exit code.
        if (!this.files.has(unq(m[1]!))) return { exitCode: 124, stdout: '', stderr: '', success: false };
        continue;
      }
      m = md.exec(part);
      if (m) {
        this.dirs.add(unq(m[1]!));
        continue;
      }
      m = mf.exec(part);
      if (m) {
        if (!this.files.has(unq(m[1]!))) this.files.set(unq(m[1]!), new Uint8Array());
        continue;
      }
      m = pf.exec(part);
      if (m) {
        this.files.set(unq(m[2]!), encoder.encode(unq(m[1]!)));
        continue;
      }
      return { exitCode: 127, stdout: '', stderr: `fake exec: unsupported command ${part}`, success: false };
    }
    return { exitCode: 0, stdout: '', stderr: '', success: true };
  });

  destroy = vi.fn(async () => {
    this.procs.clear();
    this.files.clear();
  });
}

export interface GetSandboxCall {
  id: string;
  options: Record<string, unknown> | undefined;
}

export const registry = {
  sandboxes: new Map<string, FakeSandbox>(),
  calls: [] as GetSandboxCall[],
};

/** The fake behind sandbox id `id` (created on first use, like a Durable Object). */
export function fakeFor(id: string): FakeSandbox {
  let sb = registry.sandboxes.get(id);
  if (!sb) {
    sb = new FakeSandbox(id);
    registry.sandboxes.set(id, sb);
  }
  return sb;
}

export function resetFakes(): void {
  registry.sandboxes.clear();
  registry.calls.length = 0;
}

class BaseSandbox {
  static outboundByHost: Record<string, unknown> | undefined;
  static outbound: unknown;
  interceptHttps = false;
  enableInternet: boolean | undefined = true;
  allowedHosts: string[] | undefined;

  constructor(
    readonly ctx: unknown,
    readonly env: unknown,
  ) {}
}

class ContainerProxy {}

async function collectFile(stream: ReadableStream<Uint8Array>): Promise<{ content: Uint8Array; metadata: Record<string, unknown> }> {
  const chunks: Uint8Array[] = [];
  const reader = stream.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
  }
  const total = chunks.reduce((n, c) => n + c.length, 0);
  const content = new Uint8Array(total);
  let off = 0;
  for (const c of chunks) {
    content.set(c, off);
    off += c.length;
  }
  return { content, metadata: { isBinary: true, size: total, mimeType: 'application/octet-stream', encoding: 'base64' } };
}

export const sdkModule = {
  getSandbox: vi.fn((_ns: unknown, id: string, options?: Record<string, unknown>) => {
    registry.calls.push({ id, options });
    return fakeFor(id);
  }),
  collectFile,
  Sandbox: BaseSandbox,
  ContainerProxy,
};
