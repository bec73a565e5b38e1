// Bearer-token authentication.
//
// The token is compared in constant time: both the presented and the expected
// token are hashed with SHA-256 (so the comparison always runs over 32 equal-
// length bytes and leaks neither content nor length), then the digests are
// compared with `crypto.subtle.timingSafeEqual` (a Workers extension) or, where
// that is absent (Node, tests), with a branch-free XOR loop.

import { errorResponse } from './errors';

const encoder = new TextEncoder();

async function sha256(s: string): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.digest('SHA-256', encoder.encode(s)));
}

type TimingSafeSubtle = SubtleCrypto & {
  timingSafeEqual?: (a: ArrayBuffer | ArrayBufferView, b: ArrayBuffer | ArrayBufferView) => boolean;
};

/** XOR-accumulating comparison of two byte arrays of equal length. */
export function xorEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= (a[i] ?? 0) ^ (b[i] ?? 0);
  return diff === 0;
}

/** Constant-time string equality (hash both, compare digests). */
export async function constantTimeEqual(given: string, expected: string): Promise<boolean> {
  const [a, b] = await Promise.all([sha256(given), sha256(expected)]);
  const subtle = crypto.subtle as TimingSafeSubtle;
  if (typeof subtle.timingSafeEqual === 'function') return subtle.timingSafeEqual(a, b);
  return xorEqual(a, b);
}

/** Extracts the token of an `Authorization: Bearer <token>` header, or null. */
export function bearerToken(request: Request): string | null {
  const h = request.headers.get('Authorization');
  if (h === null) return null;
  const m = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(h);
  return m?.[1] ?? null;
}

/**
 * Checks the request's bearer token against `expected`. Returns null when the
 * request may proceed, or the error response to send: 503 not_configured when
 * the secret is unset or empty, 401 unauthorized when the token is missing or wrong.
 */
export async function authorize(request: Request, expected: string | undefined): Promise<Response | null> {
  if (expected === undefined || expected === '') {
    return errorResponse(503, 'not_configured', 'the bridge has no BRIDGE_TOKEN secret; it refuses to serve until one is set');
  }
  const given = bearerToken(request);
  // Always run the comparison, even without a token, so both paths cost the same.
  const ok = await constantTimeEqual(given ?? '', expected);
  if (given === null || !ok) {
    return errorResponse(401, 'unauthorized', 'missing or invalid bearer token', { 'WWW-Authenticate': 'Bearer' });
  }
  return null;
}
