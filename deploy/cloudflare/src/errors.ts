// Error values and JSON responses of the bridge.
//
// Every error the bridge returns is JSON `{"error": "<message>", "code": "<code>"}`
// with a status from this set (README "Errors"):
//   400 invalid request, 401 unauthorized, 404 not found, 405 method not allowed,
//   409 conflict, 413 payload too large / file too large, 502 sandbox error (not retryable as such),
//   503 unavailable (retryable: container not ready, capacity, not configured).

/** An error that maps directly to an HTTP error response. */
export class HttpError extends Error {
  readonly status: number;
  readonly code: string;

  constructor(status: number, code: string, message: string) {
    super(message);
    this.name = 'HttpError';
    this.status = status;
    this.code = code;
  }
}

/** Shorthand for a 400 with a specific code. */
export function invalid(code: string, message: string): HttpError {
  return new HttpError(400, code, message);
}

const JSON_HEADERS = { 'Content-Type': 'application/json; charset=utf-8', 'Cache-Control': 'no-store' };

/** A JSON response with the given status. */
export function jsonResponse(body: unknown, status = 200, headers?: Record<string, string>): Response {
  return new Response(JSON.stringify(body), { status, headers: { ...JSON_HEADERS, ...headers } });
}

/** The bridge's JSON error body `{error, code}`. */
export function errorResponse(status: number, code: string, message: string, headers?: Record<string, string>): Response {
  return jsonResponse({ error: message, code }, status, headers);
}

/** Converts any thrown value to an error response. */
export function toErrorResponse(err: unknown): Response {
  const e = err instanceof HttpError ? err : fromSdkError(err);
  return errorResponse(e.status, e.code, e.message);
}

function stringProp(obj: unknown, key: string): string | undefined {
  if (obj !== null && typeof obj === 'object' && key in obj) {
    const v = (obj as Record<string, unknown>)[key];
    if (typeof v === 'string') return v;
  }
  return undefined;
}

function numberProp(obj: unknown, key: string): number | undefined {
  if (obj !== null && typeof obj === 'object' && key in obj) {
    const v = (obj as Record<string, unknown>)[key];
    if (typeof v === 'number') return v;
  }
  return undefined;
}

// SDK error codes (ErrorCode in @cloudflare/sandbox) we translate to statuses.
const NOT_FOUND_CODES = new Set(['FILE_NOT_FOUND', 'PROCESS_NOT_FOUND', 'COMMAND_NOT_FOUND', 'CONTEXT_NOT_FOUND']);
const UNAVAILABLE_CODES = new Set(['CONTAINER_UNAVAILABLE', 'RPC_TRANSPORT_ERROR']);
const CONFLICT_CODES = new Set(['OPERATION_INTERRUPTED', 'FILE_EXISTS', 'SESSION_ALREADY_EXISTS']);
const BAD_REQUEST_CODES = new Set(['VALIDATION_FAILED', 'IS_DIRECTORY', 'NOT_DIRECTORY', 'NAME_TOO_LONG', 'PERMISSION_DENIED']);

/**
 * Maps an error thrown by the Sandbox SDK to an HttpError.
 *
 * Errors that cross the Durable Object RPC boundary may lose their class and
 * custom properties, so this looks at `code`, then `httpStatus`, then the
 * message text.
 */
export function fromSdkError(err: unknown): HttpError {
  if (err instanceof HttpError) return err;
  const message = err instanceof Error ? err.message : typeof err === 'string' ? err : 'unknown sandbox error';
  const code = stringProp(err, 'code');
  if (code !== undefined) {
    if (NOT_FOUND_CODES.has(code)) return new HttpError(404, code.toLowerCase(), message);
    if (UNAVAILABLE_CODES.has(code)) return new HttpError(503, code.toLowerCase(), message);
    if (CONFLICT_CODES.has(code)) return new HttpError(409, code.toLowerCase(), message);
    if (BAD_REQUEST_CODES.has(code) || code.startsWith('INVALID_')) return new HttpError(400, code.toLowerCase(), message);
    if (code === 'FILE_TOO_LARGE') return new HttpError(413, 'file_too_large', message);
  }
  const status = numberProp(err, 'httpStatus');
  if (status === 404) return new HttpError(404, 'not_found', message);
  if (status === 409) return new HttpError(409, 'conflict', message);
  if (status === 503) return new HttpError(503, 'unavailable', message);
  if (status === 400) return new HttpError(400, 'invalid_request', message);
  if (/\bnot found\b/i.test(message)) return new HttpError(404, 'not_found', message);
  if (/container.*(unavailable|not ready|not running)|no container instance|capacity|currently provisioning/i.test(message)) {
    return new HttpError(503, 'container_unavailable', message);
  }
  if (/interrupted/i.test(message)) return new HttpError(409, 'operation_interrupted', message);
  return new HttpError(502, 'sandbox_error', message);
}
