// Validation of everything that comes from the client: ids, paths, env,
// durations, offsets. Each function throws an HttpError (400) on bad input.

import { invalid } from './errors';

/** Root of the sandbox workspace; every path the client names must be inside it. */
export const WORKSPACE = '/workspace';

const SANDBOX_ID_RE = /^[A-Za-z0-9_-]{1,128}$/;
const PROC_ID_RE = /^[A-Za-z0-9_-]{1,200}$/;

/** Sandbox ids: [A-Za-z0-9_-], 1 to 128 characters (as pkg/sandbox.Spec.ID). */
export function checkSandboxId(id: string): string {
  if (!SANDBOX_ID_RE.test(id)) throw invalid('invalid_id', 'sandbox id must match [A-Za-z0-9_-]{1,128}');
  return id;
}

/** Process ids: [A-Za-z0-9_-], 1 to 200 characters. */
export function checkProcId(id: unknown): string {
  if (typeof id !== 'string' || !PROC_ID_RE.test(id)) {
    throw invalid('invalid_proc_id', 'proc_id must match [A-Za-z0-9_-]{1,200}');
  }
  return id;
}

/**
 * Resolves a client path to an absolute path inside /workspace.
 *
 * Relative paths are taken from /workspace; absolute paths must already be
 * /workspace or below it. Any `..` segment is rejected outright (even one that
 * would stay inside), as are empty paths, NUL and other control characters.
 * `.` and repeated slashes are normalised away. Returns the normalised path.
 *
 * This confines the API surface only: processes in the sandbox run as root
 * and can reach anything in the container, including through symlinks.
 */
export function resolveWorkspacePath(raw: unknown, what: string, allowRoot = false): string {
  if (typeof raw !== 'string' || raw === '') throw invalid('invalid_path', `${what} is required`);
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(raw)) throw invalid('invalid_path', `${what} must not contain control characters`);
  if (raw.length > 4096) throw invalid('invalid_path', `${what} is too long`);
  const segments = raw.split('/');
  if (segments.includes('..')) throw invalid('invalid_path', `${what} must not contain '..'`);
  let rel: string[];
  if (raw.startsWith('/')) {
    const parts = segments.filter((s) => s !== '' && s !== '.');
    if (parts[0] !== 'workspace') throw invalid('invalid_path', `${what} must be inside ${WORKSPACE}`);
    rel = parts.slice(1);
  } else {
    rel = segments.filter((s) => s !== '' && s !== '.');
  }
  if (rel.length === 0 && !allowRoot) throw invalid('invalid_path', `${what} must name a file inside ${WORKSPACE}`);
  return rel.length === 0 ? WORKSPACE : `${WORKSPACE}/${rel.join('/')}`;
}

/** Parent directory of an absolute path produced by resolveWorkspacePath. */
export function parentDir(path: string): string {
  const i = path.lastIndexOf('/');
  return i <= 0 ? '/' : path.slice(0, i);
}

const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;

// Names that must never be passed into a sandbox, whatever their value: the
// agent's credentials reach the API only through egress interception.
const FORBIDDEN_ENV = new Set(['ANTHROPIC_API_KEY', 'ANTHROPIC_AUTH_TOKEN', 'CLAUDE_CODE_OAUTH_TOKEN', 'BRIDGE_TOKEN']);
// Whole-word parts (between underscores) that mark a name as secret-looking.
const SECRET_WORDS = new Set([
  'KEY', 'APIKEY', 'TOKEN', 'SECRET', 'SECRETS', 'PASSWORD', 'PASSWD', 'PASS', 'PASSPHRASE',
  'CREDENTIAL', 'CREDENTIALS', 'CREDS', 'AUTH', 'COOKIE', 'PRIVATE', 'SIGNATURE',
]);
// Substrings that mark a name as secret-looking wherever they appear.
const SECRET_PARTS = ['SECRET', 'PASSWORD', 'PASSWD', 'CREDENTIAL', 'APIKEY', 'API_KEY', 'PRIVATE_KEY', 'ACCESS_KEY'];

/**
 * Reports whether an environment variable name looks like it carries a secret.
 * Matches known credential names, whole underscore-separated words such as
 * KEY, TOKEN, AUTH (GITHUB_TOKEN, SSH_KEY, NPM_AUTH) and substrings such as
 * SECRET, PASSWORD, API_KEY. Counts like CLAUDE_CODE_MAX_OUTPUT_TOKENS or
 * MAX_THINKING_TOKENS are not secrets and pass.
 */
export function isSecretEnvName(name: string): boolean {
  const upper = name.toUpperCase();
  if (FORBIDDEN_ENV.has(upper)) return true;
  if (upper.startsWith('ANTHROPIC_') && upper !== 'ANTHROPIC_MODEL' && upper !== 'ANTHROPIC_SMALL_FAST_MODEL') {
    // ANTHROPIC_BASE_URL and friends would redirect the agent around the egress
    // handler; only model selection is allowed.
    return true;
  }
  if (upper.split('_').some((w) => SECRET_WORDS.has(w))) return true;
  return SECRET_PARTS.some((p) => upper.includes(p));
}

/**
 * Validates an env object from a request: names must be shell identifiers,
 * values strings without NUL, and no name may look like a secret (rejected
 * with 400 forbidden_env, naming the variable but never echoing its value).
 */
export function parseEnv(raw: unknown, what = 'env'): Record<string, string> {
  if (raw === undefined || raw === null) return {};
  if (typeof raw !== 'object' || Array.isArray(raw)) throw invalid('invalid_env', `${what} must be an object of strings`);
  const out: Record<string, string> = {};
  const entries = Object.entries(raw as Record<string, unknown>);
  if (entries.length > 256) throw invalid('invalid_env', `${what} has too many variables (max 256)`);
  for (const [name, value] of entries) {
    if (!ENV_NAME_RE.test(name) || name.length > 256) throw invalid('invalid_env', `${what}: invalid variable name ${JSON.stringify(name.slice(0, 64))}`);
    if (typeof value !== 'string') throw invalid('invalid_env', `${what}.${name} must be a string`);
    if (value.includes('\u0000')) throw invalid('invalid_env', `${what}.${name} must not contain NUL`);
    if (isSecretEnvName(name)) {
      throw invalid('forbidden_env', `${what}.${name} looks like a secret; secrets never enter the sandbox (the API key is injected by egress interception)`);
    }
    out[name] = value;
  }
  return out;
}

/**
 * Parses sleep_after: a number of seconds (integer > 0) or a string like
 * "90s", "15m", "1h". Returns the value in the SDK's accepted form.
 */
export function parseSleepAfter(raw: unknown): string | number | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw === 'number') {
    if (!Number.isInteger(raw) || raw <= 0 || raw > 7 * 24 * 3600) throw invalid('invalid_sleep_after', 'sleep_after must be a positive number of seconds (at most 7 days)');
    return raw;
  }
  if (typeof raw === 'string' && /^[1-9][0-9]{0,6}[smh]$/.test(raw)) return raw;
  throw invalid('invalid_sleep_after', 'sleep_after must be seconds (number) or a string like "30s", "15m", "1h"');
}

/** Parses timeout_ms: a positive integer of milliseconds, at most 7 days. */
export function parseTimeoutMs(raw: unknown): number | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw !== 'number' || !Number.isInteger(raw) || raw <= 0 || raw > 7 * 24 * 3600 * 1000) {
    throw invalid('invalid_timeout', 'timeout_ms must be a positive integer (at most 7 days)');
  }
  return raw;
}

/**
 * Parses resume offsets "<stdout>,<stderr>" (non-negative integers of bytes
 * already delivered). A single number means stdout only. Absent means 0,0.
 */
export function parseFrom(raw: string | null): [number, number] {
  if (raw === null || raw === '') return [0, 0];
  const m = /^([0-9]{1,15})(?:,([0-9]{1,15}))?$/.exec(raw);
  if (!m) throw invalid('invalid_from', 'from must be "<stdout bytes>,<stderr bytes>"');
  return [Number(m[1]), m[2] === undefined ? 0 : Number(m[2])];
}

const SIGNALS = new Set(['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP', 'SIGQUIT']);

/** Validates an optional signal name ("SIGTERM" or "TERM"); returns the SIG form. */
export function parseSignal(raw: unknown): string | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (typeof raw === 'string') {
    const s = raw.toUpperCase().startsWith('SIG') ? raw.toUpperCase() : `SIG${raw.toUpperCase()}`;
    if (SIGNALS.has(s)) return s;
  }
  throw invalid('invalid_signal', `signal must be one of ${[...SIGNALS].join(', ')}`);
}

/** Reads a boolean-ish query flag ("1", "true", "yes"). */
export function queryFlag(url: URL, name: string): boolean {
  const v = url.searchParams.get(name);
  return v !== null && /^(1|true|yes)$/i.test(v);
}
