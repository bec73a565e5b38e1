// Routing and route handlers of the bridge. See README.md for the
// protocol as clients see it.

import { getSandbox, collectFile } from '@cloudflare/sandbox';
import { authorize } from './auth';
import { placeholderEnv } from './egress';
import type { Env } from './env';
import { errorResponse, fromSdkError, HttpError, invalid, jsonResponse, toErrorResponse } from './errors';
import { closeModelRun, openModelRun, reportModelRun, type ModelApi } from './model-routes';
import { buildCommand, parseArgv } from './shell';
import {
  appendCommand,
  ensureFifo,
  holderCommand,
  holderId,
  MAX_STDIN_WRITE,
  parseAppliedOffset,
  parseStdinOffset,
  planWrite,
  stdinPaths,
} from './stdin';
import { DEFAULT_PING_MS, openProcessStream, type StreamSandbox } from './stream';
import { versionBody } from './version';
import {
  checkProcId,
  checkSandboxId,
  parentDir,
  parseEnv,
  parseFrom,
  parseSignal,
  parseSleepAfter,
  parseTimeoutMs,
  queryFlag,
  resolveWorkspacePath,
  WORKSPACE,
} from './validate';

/** Options of a bridge instance (tests shorten the ping interval and limits). */
export interface BridgeOptions {
  /** Interval of `: ping` comments on streams (15 s). */
  pingMs?: number;
  /** Largest file accepted by PUT file (32 MiB, the SDK's RPC payload limit). */
  maxFileBytes?: number;
  /** Largest JSON request body (1 MiB). */
  maxJsonBytes?: number;
}

const DEFAULT_MAX_FILE = 32 * 1024 * 1024;
const DEFAULT_MAX_JSON = 1024 * 1024;
const DEFAULT_SLEEP_AFTER = '10m';
const TRANSPORTS = new Set(['rpc', 'http', 'websocket']);

/** The SDK surface the bridge uses (a subset of the SDK's Sandbox stub). */
interface ProcessInfo {
  id: string;
  pid?: number | undefined;
  command: string;
  status: string;
  exitCode?: number | undefined;
}

interface SandboxApi extends StreamSandbox {
  setEnvVars(envVars: Record<string, string | undefined>): Promise<void>;
  mkdir(path: string, options?: { recursive?: boolean }): Promise<unknown>;
  startProcess(
    command: string,
    options?: { processId?: string; env?: Record<string, string>; cwd?: string; autoCleanup?: boolean },
  ): Promise<ProcessInfo>;
  getProcess(id: string): Promise<ProcessInfo | null>;
  killProcess(id: string, signal?: string): Promise<void>;
  writeFile(path: string, content: string, options?: { encoding?: string }): Promise<unknown>;
  readFileStream(path: string): Promise<ReadableStream<Uint8Array>>;
  exec(command: string, options?: { timeout?: number }): Promise<{ exitCode: number; stderr?: string }>;
  destroy(): Promise<void>;
}

type Transport = 'rpc' | 'http' | 'websocket';

function transportOf(env: Env): Transport {
  const t = env.SANDBOX_TRANSPORT ?? 'rpc';
  return (TRANSPORTS.has(t) ? t : 'rpc') as Transport;
}

function sandboxFor(env: Env, id: string, extra?: { sleepAfter?: string | number; keepAlive?: boolean }): SandboxApi {
  const stub = getSandbox(env.Sandbox, id, { transport: transportOf(env), ...extra });
  return stub as unknown as SandboxApi;
}

async function readJson(request: Request, maxBytes: number, required: boolean): Promise<Record<string, unknown>> {
  const len = Number(request.headers.get('Content-Length') ?? '0');
  if (len > maxBytes) throw new HttpError(413, 'payload_too_large', `JSON body larger than ${maxBytes} bytes`);
  const text = await request.text();
  if (text.length > maxBytes) throw new HttpError(413, 'payload_too_large', `JSON body larger than ${maxBytes} bytes`);
  if (text.trim() === '') {
    if (required) throw invalid('invalid_json', 'a JSON object body is required');
    return {};
  }
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw invalid('invalid_json', 'body is not valid JSON');
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw invalid('invalid_json', 'body must be a JSON object');
  return v as Record<string, unknown>;
}

function methodNotAllowed(allow: string[]): Response {
  return errorResponse(405, 'method_not_allowed', `method not allowed; allowed: ${allow.join(', ')}`, { Allow: allow.join(', ') });
}

function notFound(): Response {
  return errorResponse(404, 'not_found', 'no such route');
}

/** Public process status: the SDK's, with "error" reported as "failed". */
function publicStatus(status: string): string {
  return status === 'error' ? 'failed' : status;
}

const TERMINAL = new Set(['completed', 'failed', 'killed', 'error']);

/** Base64 of bytes, for the SDK's writeFile (chunked: no huge argument lists). */
function toBase64(buf: Uint8Array): string {
  let bin = '';
  for (let i = 0; i < buf.length; i += 0x8000) bin += String.fromCharCode(...buf.subarray(i, i + 0x8000));
  return btoa(bin);
}

// ---- handlers ---------------------------------------------------------------

async function putSandbox(env: Env, id: string, request: Request, o: Required<BridgeOptions>): Promise<Response> {
  const body = await readJson(request, o.maxJsonBytes, false);
  const sleepAfter = parseSleepAfter(body.sleep_after) ?? parseSleepAfter(env.SANDBOX_SLEEP_AFTER) ?? DEFAULT_SLEEP_AFTER;
  const vars = parseEnv(body.env);
  const sb = sandboxFor(env, id, { sleepAfter, keepAlive: false });
  if (Object.keys(vars).length > 0) await sb.setEnvVars(vars);
  // Any call into the container starts it; this one also guarantees the
  // workspace exists, so the response means "ready for files and processes".
  await sb.mkdir(WORKSPACE, { recursive: true });
  return jsonResponse({ id, ready: true });
}

async function deleteSandbox(env: Env, id: string): Promise<Response> {
  await sandboxFor(env, id).destroy();
  return new Response(null, { status: 204 });
}

async function startProc(env: Env, id: string, request: Request, o: Required<BridgeOptions>): Promise<Response> {
  const body = await readJson(request, o.maxJsonBytes, true);
  const procId = checkProcId(body.proc_id);
  const argv = parseArgv(body.argv);
  const cwd = body.cwd === undefined || body.cwd === null ? WORKSPACE : resolveWorkspacePath(body.cwd, 'cwd', true);
  const stdinPath = body.stdin_path === undefined || body.stdin_path === null ? undefined : resolveWorkspacePath(body.stdin_path, 'stdin_path');
  const timeoutMs = parseTimeoutMs(body.timeout_ms);
  const procEnv = { ...placeholderEnv(env), ...parseEnv(body.env) };
  if (body.stdin !== undefined && body.stdin !== null && body.stdin !== 'pipe') throw invalid('invalid_stdin', 'stdin must be "pipe" when given');
  const pipe = body.stdin === 'pipe';
  if (pipe && stdinPath !== undefined) throw invalid('invalid_stdin', 'stdin "pipe" and stdin_path are mutually exclusive');
  const sp = stdinPaths(procId);
  const command = pipe ? `${ensureFifo(sp)} && ${buildCommand({ argv, stdinPath: sp.fifo, timeoutMs })}` : buildCommand({ argv, stdinPath, timeoutMs });

  const sb = sandboxFor(env, id);
  if (pipe) await startHolder(sb, procId);
  const reply = (p: ProcessInfo): Response => jsonResponse({ proc_id: procId, pid: typeof p.pid === 'number' ? p.pid : null });
  const sameCommand = (p: ProcessInfo): boolean => typeof p.command !== 'string' || p.command === command;

  const existing = await sb.getProcess(procId);
  if (existing) {
    if (!sameCommand(existing)) throw new HttpError(409, 'proc_id_conflict', `proc_id ${procId} already runs a different command`);
    return reply(existing);
  }
  try {
    const p = await sb.startProcess(command, { processId: procId, env: procEnv, cwd, autoCleanup: false });
    return reply(p);
  } catch (err) {
    // A concurrent request with the same proc_id may have won the race.
    const again = await sb.getProcess(procId).catch(() => null);
    if (again) {
      if (!sameCommand(again)) throw new HttpError(409, 'proc_id_conflict', `proc_id ${procId} already runs a different command`);
      return reply(again);
    }
    throw fromSdkError(err);
  }
}

/** Starts (idempotently) the process that holds the FIFO's write end open. */
async function startHolder(sb: SandboxApi, procId: string): Promise<void> {
  const hid = holderId(procId);
  if (await sb.getProcess(hid)) return;
  // The FIFO exists before start returns: a first write can neither find it
  // missing nor create a regular file in its place.
  const r = await sb.exec(ensureFifo(stdinPaths(procId)));
  if (r.exitCode !== 0) throw new HttpError(502, 'stdin_setup_failed', `could not create the stdin pipe of process ${procId} (exit ${r.exitCode})`);
  try {
    await sb.startProcess(holderCommand(stdinPaths(procId)), { processId: hid, autoCleanup: false });
  } catch (err) {
    if (await sb.getProcess(hid).catch(() => null)) return; // a concurrent start won
    throw fromSdkError(err);
  }
}

async function readText(sb: SandboxApi, path: string): Promise<string | null> {
  try {
    const { content } = await collectFile(await sb.readFileStream(path));
    return typeof content === 'string' ? content : new TextDecoder().decode(content);
  } catch (err) {
    const e = fromSdkError(err);
    if (e.status === 404) return null;
    throw e;
  }
}

/** Looks up an interactive process: 404 unknown, 409 not interactive. */
async function interactiveProc(sb: SandboxApi, id: string, procId: string): Promise<ProcessInfo> {
  const p = await sb.getProcess(procId);
  if (!p) throw new HttpError(404, 'proc_not_found', `no process ${procId} in sandbox ${id}`);
  if (!(await sb.getProcess(holderId(procId)))) throw new HttpError(409, 'not_interactive', `process ${procId} was not started with stdin "pipe"`);
  return p;
}

async function writeStdin(env: Env, id: string, procId: string, url: URL, request: Request): Promise<Response> {
  const off = parseStdinOffset(url.searchParams.get('off'));
  const len = Number(request.headers.get('Content-Length') ?? '0');
  if (len > MAX_STDIN_WRITE) throw new HttpError(413, 'payload_too_large', `stdin write larger than ${MAX_STDIN_WRITE} bytes`);
  const buf = new Uint8Array(await request.arrayBuffer());
  if (buf.byteLength > MAX_STDIN_WRITE) throw new HttpError(413, 'payload_too_large', `stdin write larger than ${MAX_STDIN_WRITE} bytes`);
  const sb = sandboxFor(env, id);
  const p = await interactiveProc(sb, id, procId);
  const sp = stdinPaths(procId);
  const applied = parseAppliedOffset(await readText(sb, sp.off));
  const plan = planWrite(off, buf.byteLength, applied);
  // A retry of a write that was applied succeeds in every state.
  if (plan.kind === 'duplicate') return jsonResponse({ off: applied });
  if (plan.kind === 'gap') {
    return jsonResponse({ error: `write at offset ${off} but only ${applied} bytes were applied`, code: 'stdin_gap', off: applied }, 409);
  }
  if ((await readText(sb, sp.closed)) !== null) throw new HttpError(409, 'stdin_closed', `stdin of process ${procId} is closed`);
  if (TERMINAL.has(p.status)) throw new HttpError(409, 'proc_exited', `process ${procId} has exited`);
  const rest = buf.subarray(plan.skip);
  await sb.writeFile(sp.chunk, toBase64(rest), { encoding: 'base64' });
  const r = await sb.exec(appendCommand(sp, plan.end));
  if (r.exitCode !== 0) {
    const now = await sb.getProcess(procId);
    if (!now || TERMINAL.has(now.status)) throw new HttpError(409, 'proc_exited', `process ${procId} has exited`);
    // Not applied (the offset was not recorded): the client retries the same write.
    throw new HttpError(503, 'stdin_write_failed', `writing to the stdin of process ${procId} failed (exit ${r.exitCode}); retry`);
  }
  return jsonResponse({ off: plan.end });
}

async function closeStdin(env: Env, id: string, procId: string): Promise<Response> {
  const sb = sandboxFor(env, id);
  await interactiveProc(sb, id, procId);
  const sp = stdinPaths(procId);
  await sb.writeFile(sp.closed, '');
  const h = await sb.getProcess(holderId(procId));
  if (h && !TERMINAL.has(h.status)) await sb.killProcess(holderId(procId), 'SIGKILL');
  return jsonResponse({ closed: true });
}

async function getProc(env: Env, id: string, procId: string): Promise<Response> {
  const p = await sandboxFor(env, id).getProcess(procId);
  if (!p) throw new HttpError(404, 'proc_not_found', `no process ${procId} in sandbox ${id}`);
  const out: { status: string; exit_code?: number } = { status: publicStatus(p.status) };
  if (typeof p.exitCode === 'number') out.exit_code = p.exitCode;
  return jsonResponse(out);
}

async function killProc(env: Env, id: string, procId: string, request: Request, o: Required<BridgeOptions>): Promise<Response> {
  const body = await readJson(request, o.maxJsonBytes, false);
  const signal = parseSignal(body.signal);
  const sb = sandboxFor(env, id);
  const p = await sb.getProcess(procId);
  if (!p) throw new HttpError(404, 'proc_not_found', `no process ${procId} in sandbox ${id}`);
  if (TERMINAL.has(p.status)) return jsonResponse({ killed: false });
  await sb.killProcess(procId, signal);
  return jsonResponse({ killed: true });
}

async function streamProc(env: Env, id: string, procId: string, request: Request, url: URL, ctx: ExecutionContext, o: Required<BridgeOptions>): Promise<Response> {
  const fromParam = url.searchParams.get('from') ?? request.headers.get('Last-Event-ID');
  const from = parseFrom(fromParam);
  const sb = sandboxFor(env, id);
  try {
    return await openProcessStream({
      sandbox: sb,
      procId,
      from,
      killOnDisconnect: queryFlag(url, 'kill_on_disconnect'),
      signal: request.signal,
      waitUntil: (p) => ctx.waitUntil(p),
      pingMs: o.pingMs,
    });
  } catch (err) {
    const e = fromSdkError(err);
    if (e.status === 404) throw new HttpError(404, 'proc_not_found', `no process ${procId} in sandbox ${id}`);
    throw e;
  }
}

async function putFile(env: Env, id: string, url: URL, request: Request, o: Required<BridgeOptions>): Promise<Response> {
  const path = resolveWorkspacePath(url.searchParams.get('path'), 'path');
  const len = Number(request.headers.get('Content-Length') ?? '0');
  if (len > o.maxFileBytes) throw new HttpError(413, 'payload_too_large', `file larger than ${o.maxFileBytes} bytes`);
  const buf = new Uint8Array(await request.arrayBuffer());
  if (buf.byteLength > o.maxFileBytes) throw new HttpError(413, 'payload_too_large', `file larger than ${o.maxFileBytes} bytes`);
  const sb = sandboxFor(env, id);
  const dir = parentDir(path);
  if (dir !== WORKSPACE) await sb.mkdir(dir, { recursive: true });
  await sb.writeFile(path, toBase64(buf), { encoding: 'base64' });
  return new Response(null, { status: 204 });
}

async function getFile(env: Env, id: string, url: URL): Promise<Response> {
  const path = resolveWorkspacePath(url.searchParams.get('path'), 'path');
  const sb = sandboxFor(env, id);
  let content: string | Uint8Array;
  try {
    const stream = await sb.readFileStream(path);
    ({ content } = await collectFile(stream));
  } catch (err) {
    const e = fromSdkError(err);
    if (e.status === 404) throw new HttpError(404, 'file_not_found', `no file ${path} in sandbox ${id}`);
    throw e;
  }
  const bytes = typeof content === 'string' ? new TextEncoder().encode(content) : content;
  return new Response(bytes, {
    status: 200,
    headers: { 'Content-Type': 'application/octet-stream', 'Content-Length': String(bytes.byteLength), 'Cache-Control': 'no-store' },
  });
}

// ---- router -----------------------------------------------------------------

async function route(request: Request, env: Env, ctx: ExecutionContext, url: URL, o: Required<BridgeOptions>): Promise<Response> {
  const seg = url.pathname.split('/').slice(1); // "", "v1", "sb", ...
  if (seg[0] === 'v1' && seg[1] === 'version' && seg.length === 2) {
    if (request.method === 'GET') return jsonResponse(versionBody());
    return methodNotAllowed(['GET']);
  }
  if (seg[0] !== 'v1' || seg[1] !== 'sb' || seg.length < 3) return notFound();
  const id = checkSandboxId(seg[2] ?? '');
  const m = request.method;
  const rest = seg.slice(3);

  if (rest.length === 0) {
    if (m === 'PUT') return putSandbox(env, id, request, o);
    if (m === 'DELETE') return deleteSandbox(env, id);
    return methodNotAllowed(['PUT', 'DELETE']);
  }
  if (rest[0] === 'model' && rest.length === 1) {
    const sb = sandboxFor(env, id) as unknown as ModelApi;
    if (m === 'PUT') return openModelRun(sb, await readJson(request, o.maxJsonBytes, true));
    if (m === 'GET') return reportModelRun(sb, id, url);
    if (m === 'DELETE') return closeModelRun(sb, id, url);
    return methodNotAllowed(['PUT', 'GET', 'DELETE']);
  }
  if (rest[0] === 'file' && rest.length === 1) {
    if (m === 'PUT') return putFile(env, id, url, request, o);
    if (m === 'GET') return getFile(env, id, url);
    return methodNotAllowed(['PUT', 'GET']);
  }
  if (rest[0] === 'proc') {
    if (rest.length === 1) {
      if (m === 'POST') return startProc(env, id, request, o);
      return methodNotAllowed(['POST']);
    }
    const procId = checkProcId(rest[1]);
    if (rest.length === 2) {
      if (m === 'GET') return getProc(env, id, procId);
      return methodNotAllowed(['GET']);
    }
    if (rest.length === 3 && rest[2] === 'stream') {
      if (m === 'GET') return streamProc(env, id, procId, request, url, ctx, o);
      return methodNotAllowed(['GET']);
    }
    if (rest.length === 3 && rest[2] === 'stdin') {
      if (m === 'POST') return writeStdin(env, id, procId, url, request);
      return methodNotAllowed(['POST']);
    }
    if (rest.length === 4 && rest[2] === 'stdin' && rest[3] === 'close') {
      if (m === 'POST') return closeStdin(env, id, procId);
      return methodNotAllowed(['POST']);
    }
    if (rest.length === 3 && rest[2] === 'kill') {
      if (m === 'POST') return killProc(env, id, procId, request, o);
      return methodNotAllowed(['POST']);
    }
  }
  return notFound();
}

/** Builds the Worker's fetch handler. */
export function createBridge(options: BridgeOptions = {}): ExportedHandler<Env> {
  const o: Required<BridgeOptions> = {
    pingMs: options.pingMs ?? DEFAULT_PING_MS,
    maxFileBytes: options.maxFileBytes ?? DEFAULT_MAX_FILE,
    maxJsonBytes: options.maxJsonBytes ?? DEFAULT_MAX_JSON,
  };
  return {
    async fetch(request, env, ctx): Promise<Response> {
      const url = new URL(request.url);
      if (url.pathname === '/healthz') {
        if (request.method !== 'GET') return methodNotAllowed(['GET']);
        return jsonResponse({ ok: true });
      }
      const denied = await authorize(request, env.BRIDGE_TOKEN);
      if (denied) return denied;
      try {
        return await route(request, env, ctx, url, o);
      } catch (err) {
        const resp = toErrorResponse(err);
        if (resp.status >= 500) {
          // Never log bodies, env or tokens: route, status and code only.
          const code = err instanceof HttpError ? err.code : fromSdkError(err).code;
          console.error(JSON.stringify({ msg: 'bridge error', method: request.method, path: url.pathname, status: resp.status, code }));
        }
        return resp;
      }
    },
  };
}
