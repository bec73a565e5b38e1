// Building the one command string the Sandbox SDK takes from an argv.
//
// startProcess() takes a shell command line, so every argv element is wrapped
// in single quotes, inside which a POSIX shell gives no character a special
// meaning; an embedded single quote is written as '\'' (close, escaped quote,
// reopen). The result is plain POSIX sh: no $'…', no bash-isms. NUL cannot be
// represented in an argv and is rejected.

import { invalid } from './errors';

/** Quotes one argument for a POSIX shell. */
export function shellQuote(arg: string): string {
  return `'${arg.replaceAll("'", "'\\''")}'`;
}

/** Maximum length of the built command line (the prompt belongs in stdin_path). */
export const MAX_COMMAND_BYTES = 256 * 1024;

/** Grace between SIGTERM and SIGKILL when timeout_ms expires. */
export const TIMEOUT_KILL_AFTER = '10s';

export interface CommandSpec {
  argv: string[];
  /** Absolute, already-confined path of the file to use as stdin. */
  stdinPath?: string | undefined;
  /** Wall-clock limit enforced with coreutils `timeout` (exit code 124). */
  timeoutMs?: number | undefined;
}

/** Validates a request's argv: a non-empty array of strings without NUL. */
export function parseArgv(raw: unknown): string[] {
  if (!Array.isArray(raw) || raw.length === 0) throw invalid('invalid_argv', 'argv must be a non-empty array of strings');
  if (raw.length > 4096) throw invalid('invalid_argv', 'argv has too many elements');
  const out: string[] = [];
  for (const [i, a] of raw.entries()) {
    if (typeof a !== 'string') throw invalid('invalid_argv', `argv[${i}] must be a string`);
    if (a.includes('\u0000')) throw invalid('invalid_argv', `argv[${i}] must not contain NUL`);
    out.push(a);
  }
  if (out[0] === '') throw invalid('invalid_argv', 'argv[0] must not be empty');
  return out;
}

function formatSeconds(ms: number): string {
  // coreutils timeout accepts fractional seconds.
  const s = (ms / 1000).toFixed(3).replace(/\.?0+$/, '');
  return `${s}s`;
}

/**
 * Builds the command line for startProcess:
 *
 *   [timeout -k 10s -- <secs>s] 'argv0' 'argv1' … < 'stdin_path' | < /dev/null
 *
 * stdin is always redirected, from /dev/null when no stdin_path is given, so
 * a program that reads stdin never blocks on the sandbox's session shell.
 */
export function buildCommand(spec: CommandSpec): string {
  const parts: string[] = [];
  if (spec.timeoutMs !== undefined) {
    // `--` must come before the duration: timeout stops parsing options at its
    // first operand, so a `--` after the duration would be taken as the command.
    parts.push('timeout', '-k', TIMEOUT_KILL_AFTER, '--', formatSeconds(spec.timeoutMs));
  }
  parts.push(...spec.argv.map(shellQuote));
  parts.push('<', spec.stdinPath !== undefined ? shellQuote(spec.stdinPath) : '/dev/null');
  const command = parts.join(' ');
  if (new TextEncoder().encode(command).length > MAX_COMMAND_BYTES) {
    throw invalid('invalid_argv', `argv is too long (max ${MAX_COMMAND_BYTES} bytes once quoted); pass large input through stdin_path`);
  }
  return command;
}
