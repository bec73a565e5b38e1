// Routing and route handlers of the bridge (SPEC 7). See README.md for the
// protocol as clients see it.

import { getSandbox, collectFile } from '@cloudflare/sandbox';
import { authorize } from './auth';
import { placeholderEnv } from './egress';
import type { Env } from './env';
import { errorResponse, fromSdkError, HttpError, invalid, jsonResponse, toErrorResponse } from './errors';
import { buildCommand, parseArgv } from './shell';
import { DEFAULT_PING_MS, openProcessStream, type StreamSandbox } from './stream';
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
  const command = buildCommand({ argv, stdinPath, timeoutMs });

  const sb = sandboxFor(env, id);
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
  let bin = '';
  for (let i = 0; i < buf.length; i += 0x8000) bin += String.fromCharCode(...buf.subarray(i, i + 0x8000));
  const sb = sandboxFor(env, id);
  const dir = parentDir(path);
  if (dir !== WORKSPACE) await sb.mkdir(dir, { recursive: true });
  await sb.writeFile(path, btoa(bin), { encoding: 'base64' });
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
  if (seg[0] !== 'v1' || seg[1] !== 'sb' || seg.length < 3) return notFound();
  const id = checkSandboxId(seg[2] ?? '');
  const m = request.method;
  const rest = seg.slice(3);

  if (rest.length === 0) {
    if (m === 'PUT') return putSandbox(env, id, request, o);
    if (m === 'DELETE') return deleteSandbox(env, id);
    return methodNotAllowed(['PUT', 'DELETE']);
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
