import { describe, expect, it } from 'vitest';
import { HttpError, fromSdkError } from '../src/errors';
import { parseSSE } from '../src/sse';
import { isSecretEnvName, parseFrom, resolveWorkspacePath } from '../src/validate';

describe('workspace path confinement', () => {
  const ok: Array<[string, string]> = [
    ['a.txt', '/workspace/a.txt'],
    ['./a//b/./c', '/workspace/a/b/c'],
    ['/workspace/x/y', '/workspace/x/y'],
    ['//workspace//x', '/workspace/x'],
    ['dir with space/f', '/workspace/dir with space/f'],
  ];
  it.each(ok)('accepts %j as %j', (raw, want) => {
    expect(resolveWorkspacePath(raw, 'path')).toBe(want);
  });

  const bad = ['', '..', '../x', 'a/../b', 'a/..', '/workspace/..', '/workspace/../etc', '/etc/passwd', '/work', '/workspacex/y', '/', '/workspace', 'a\u0000b', 'a\tb', 'x'.repeat(5000)];
  it.each(bad)('rejects %j', (raw) => {
    expect(() => resolveWorkspacePath(raw, 'path')).toThrow(HttpError);
  });

  it('allows the workspace root itself only where asked (cwd)', () => {
    expect(resolveWorkspacePath('/workspace', 'cwd', true)).toBe('/workspace');
    expect(resolveWorkspacePath('.', 'cwd', true)).toBe('/workspace');
    expect(() => resolveWorkspacePath(42, 'cwd', true)).toThrow(HttpError);
  });
});

describe('secret-looking env names', () => {
  it.each([
    'ANTHROPIC_API_KEY', 'anthropic_api_key', 'ANTHROPIC_AUTH_TOKEN', 'ANTHROPIC_BASE_URL', 'CLAUDE_CODE_OAUTH_TOKEN', 'BRIDGE_TOKEN',
    'GITHUB_TOKEN', 'GH_TOKEN', 'NPM_AUTH', 'AWS_SECRET_ACCESS_KEY', 'AWS_ACCESS_KEY_ID', 'AWS_SESSION_TOKEN', 'OPENAI_API_KEY',
    'STRIPE_APIKEY', 'DB_PASSWORD', 'MYSQL_PWD_PASSWD', 'CLIENT_SECRET', 'CLIENTSECRET', 'SSH_PRIVATE_KEY', 'GPG_PASSPHRASE', 'KEY',
    'SESSION_COOKIE', 'GOOGLE_APPLICATION_CREDENTIALS',
  ])('rejects %s', (name) => {
    expect(isSecretEnvName(name)).toBe(true);
  });

  it.each([
    'PATH', 'HOME', 'LANG', 'FOO', 'CLAUDE_CONFIG_DIR', 'CLAUDE_CODE_MAX_OUTPUT_TOKENS', 'MAX_THINKING_TOKENS', 'ANTHROPIC_MODEL',
    'IS_SANDBOX', 'KEYBOARD_LAYOUT', 'MONKEY', 'TZ', 'DISABLE_TELEMETRY', 'FLEET_QUERY_ID',
  ])('allows %s', (name) => {
    expect(isSecretEnvName(name)).toBe(false);
  });
});

describe('from offsets', () => {
  it('parses pairs, singles and absence', () => {
    expect(parseFrom(null)).toEqual([0, 0]);
    expect(parseFrom('')).toEqual([0, 0]);
    expect(parseFrom('12,34')).toEqual([12, 34]);
    expect(parseFrom('7')).toEqual([7, 0]);
    for (const bad of ['x', '1,', ',1', '1,2,3', '-1,0', '1e3,0', ' 1,2']) expect(() => parseFrom(bad)).toThrow(HttpError);
  });
});

describe('SDK error mapping', () => {
  it('maps by code, httpStatus and message', () => {
    const withCode = (code: string) => Object.assign(new Error('m'), { code });
    expect(fromSdkError(withCode('PROCESS_NOT_FOUND')).status).toBe(404);
    expect(fromSdkError(withCode('FILE_NOT_FOUND')).status).toBe(404);
    expect(fromSdkError(withCode('CONTAINER_UNAVAILABLE')).status).toBe(503);
    expect(fromSdkError(withCode('OPERATION_INTERRUPTED')).status).toBe(409);
    expect(fromSdkError(withCode('IS_DIRECTORY')).status).toBe(400);
    expect(fromSdkError(withCode('FILE_TOO_LARGE')).status).toBe(413);
    expect(fromSdkError(Object.assign(new Error('m'), { httpStatus: 503 })).status).toBe(503);
    expect(fromSdkError(new Error('Process abc not found')).status).toBe(404);
    expect(fromSdkError(new Error('Operation was interrupted')).status).toBe(409);
    expect(fromSdkError('weird').status).toBe(502);
  });
});

describe('SSE parser', () => {
  function streamOf(...chunks: string[]): ReadableStream<Uint8Array> {
    const enc = new TextEncoder();
    return new ReadableStream({
      start(c) {
        for (const ch of chunks) c.enqueue(enc.encode(ch));
        c.close();
      },
    });
  }

  async function all(s: ReadableStream<Uint8Array>) {
    const out: unknown[] = [];
    for await (const ev of parseSSE(s)) out.push(ev);
    return out;
  }

  it('joins multi-line data, ignores event names, comments, [DONE] and non-JSON', async () => {
    expect(
      await all(streamOf('event: stdout\ndata: {"type":"stdout",\ndata: "data":"x"}\n\n', ': c\n\n', 'data: [DONE]\n\n', 'data: nope\n\n', 'data:{"a":1}\n\n')),
    ).toEqual([{ type: 'stdout', data: 'x' }, { a: 1 }]);
  });

  it('handles frames split across chunks, CRLF and a final frame without a blank line', async () => {
    expect(await all(streamOf('da', 'ta: {"n"', ':1}\r', '\n\r\n', 'data: {"n":2}'))).toEqual([{ n: 1 }, { n: 2 }]);
  });

  it('handles a multi-byte character split across chunks', async () => {
    const bytes = new TextEncoder().encode('data: {"s":"é✓"}\n\n');
    const s = new ReadableStream<Uint8Array>({
      start(c) {
        for (const b of bytes) c.enqueue(new Uint8Array([b]));
        c.close();
      },
    });
    expect(await all(s)).toEqual([{ s: 'é✓' }]);
  });

  it('stops and cancels the source when aborted', async () => {
    let cancelled = false;
    const s = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(new TextEncoder().encode('data: {"n":1}\n\n'));
      },
      cancel() {
        cancelled = true;
      },
    });
    const ac = new AbortController();
    const got: unknown[] = [];
    for await (const ev of parseSSE(s, ac.signal)) {
      got.push(ev);
      ac.abort();
    }
    expect(got).toEqual([{ n: 1 }]);
    expect(cancelled).toBe(true);
  });
});
