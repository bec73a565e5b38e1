import { describe, expect, it } from 'vitest';
import { spawnSync } from 'node:child_process';
import { buildCommand, parseArgv, shellQuote } from '../src/shell';

// The command line is run by a real POSIX sh here to prove every argv element
// arrives literally: no expansion, substitution, globbing or word splitting.

// A fresh marker per run: if `$(touch …)` were ever executed, it would exist.
const MARKER = `/tmp/agentfleet-pwned-${crypto.randomUUID()}`;

const TRICKY = [
  'plain',
  'with space',
  "it's",
  "''",
  '"double"',
  `$(touch ${MARKER})`,
  '`id`',
  '$HOME ${PATH}',
  '*',
  'a;b|c&d',
  '\\n backslash \\',
  'line1\nline2',
  'tab\there',
  '',
  '--version',
  '-e',
  'ünïcödé ✓',
  '!bang',
  '#hash',
  '~tilde',
];

// Node prints its arguments (after `--`) as JSON.
const PRINT_ARGS = [process.execPath, '-e', 'process.stdout.write(JSON.stringify(process.argv.slice(1)))', '--'];

function runSh(command: string, input?: string): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync('sh', ['-c', command], { encoding: 'utf8', input: input ?? '' });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('argv quoting', () => {
  it('single-quotes and escapes embedded single quotes', () => {
    expect(shellQuote('abc')).toBe("'abc'");
    expect(shellQuote("it's")).toBe("'it'\\''s'");
    expect(shellQuote('')).toBe("''");
    expect(shellQuote('$(x)')).toBe("'$(x)'");
  });

  it('passes quotes, spaces, $(…), backticks, globs and newlines literally through sh', () => {
    const cmd = buildCommand({ argv: [...PRINT_ARGS, ...TRICKY] });
    const r = runSh(cmd);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual(TRICKY);
    const pwned = spawnSync('test', ['-e', MARKER]);
    expect(pwned.status).not.toBe(0);
  });

  it('keeps argv literal under the timeout wrapper too', () => {
    const cmd = buildCommand({ argv: [...PRINT_ARGS, ...TRICKY], timeoutMs: 60_000 });
    expect(cmd.startsWith("timeout -k 10s -- 60s '")).toBe(true);
    const r = runSh(cmd);
    expect(r.status).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual(TRICKY);
  });

  it('timeout_ms ends a long process with exit code 124', () => {
    const cmd = buildCommand({ argv: ['sleep', '30'], timeoutMs: 200 });
    expect(cmd).toBe("timeout -k 10s -- 0.2s 'sleep' '30' < /dev/null");
    expect(runSh(cmd).status).toBe(124);
  });

  it('redirects stdin from /dev/null when no stdin_path is given', () => {
    const cat = [process.execPath, '-e', 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write("["+s+"]"))'];
    const r = runSh(buildCommand({ argv: cat }), 'the parent stdin must not be read');
    expect(r.stdout).toBe('[]');
  });

  it('feeds stdin_path (quoted) as stdin', () => {
    const dir = spawnSync('mktemp', ['-d'], { encoding: 'utf8' }).stdout.trim();
    expect(dir).not.toBe('');
    const file = `${dir}/prompt 'q' $(x).txt`;
    try {
      const w = spawnSync('sh', ['-c', 'printf "%s" "$1" > "$2"', 'sh', "the prompt, with 'quotes' and $(subst)", file]);
      expect(w.status).toBe(0);
      const cat = [process.execPath, '-e', 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(s))'];
      const cmd = buildCommand({ argv: cat, stdinPath: file });
      expect(cmd.endsWith(` < ${shellQuote(file)}`)).toBe(true);
      expect(runSh(cmd).stdout).toBe("the prompt, with 'quotes' and $(subst)");
    } finally {
      spawnSync('rm', ['-rf', dir]);
    }
  });

  it('rejects argv that is empty, not strings, contains NUL, or is too long', () => {
    expect(() => parseArgv([])).toThrow(/non-empty/);
    expect(() => parseArgv('ls')).toThrow(/non-empty/);
    expect(() => parseArgv(['ls', 3])).toThrow(/argv\[1\]/);
    expect(() => parseArgv(['ls', 'a\u0000b'])).toThrow(/NUL/);
    expect(() => parseArgv([''])).toThrow(/argv\[0\]/);
    expect(parseArgv(['ls', '-la'])).toEqual(['ls', '-la']);
    expect(() => buildCommand({ argv: ['echo', 'x'.repeat(300 * 1024)] })).toThrow(/too long/);
  });
});
