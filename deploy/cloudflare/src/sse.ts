// Server-sent events: reading the SDK's process-log stream and writing ours.
//
// The reader follows the same rules as the SDK's parseSSEStream: frames end at
// a blank line, multi-line `data:` is joined with "\n", the `event:` name is
// ignored (the HTTP transport does not send one; the RPC transport does), and
// frames whose data is empty, "[DONE]" or not JSON are skipped. The SDK
// payload's JSON `type` field ("process_info", "stdout", "stderr", "exit",
// "error") is what matters.

/** A parsed frame of the SDK's process-log stream. */
export interface UpstreamEvent {
  type?: unknown;
  data?: unknown;
  exitCode?: unknown;
  error?: unknown;
  status?: unknown;
  [k: string]: unknown;
}

/**
 * Yields the JSON payloads of an SSE byte stream. Aborting `signal` cancels the
 * underlying reader and ends the iteration.
 */
export async function* parseSSE(stream: ReadableStream<Uint8Array>, signal?: AbortSignal): AsyncGenerator<UpstreamEvent> {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  const onAbort = (): void => {
    reader.cancel().catch(() => {});
  };
  if (signal) {
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort);
  }
  let buf = '';
  let scanFrom = 0; // no '\n' before this index of buf
  let data: string[] = [];
  let haveData = false;

  const dispatch = (): UpstreamEvent | undefined => {
    if (!haveData) return undefined;
    const text = data.join('\n');
    data = [];
    haveData = false;
    if (text.trim() === '' || text === '[DONE]') return undefined;
    try {
      const v: unknown = JSON.parse(text);
      return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as UpstreamEvent) : undefined;
    } catch {
      return undefined;
    }
  };

  const handleLine = (rawLine: string): UpstreamEvent | undefined => {
    const line = rawLine.endsWith('\r') ? rawLine.slice(0, -1) : rawLine;
    if (line === '') return dispatch();
    if (line.startsWith(':')) return undefined; // comment
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') {
      data.push(value);
      haveData = true;
    }
    return undefined; // event:, id:, retry: and unknown fields are ignored
  };

  try {
    for (;;) {
      if (signal?.aborted) return;
      const { done, value } = await reader.read();
      if (signal?.aborted) return;
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let start = 0;
      let nl = buf.indexOf('\n', scanFrom);
      while (nl >= 0) {
        const ev = handleLine(buf.slice(start, nl));
        if (ev) yield ev;
        start = nl + 1;
        nl = buf.indexOf('\n', start);
      }
      buf = buf.slice(start);
      scanFrom = buf.length;
    }
    buf += decoder.decode();
    if (buf !== '') {
      const ev = handleLine(buf);
      if (ev) yield ev;
    }
    const last = dispatch();
    if (last) yield last;
  } finally {
    signal?.removeEventListener('abort', onAbort);
    reader.cancel().catch(() => {});
    try {
      reader.releaseLock();
    } catch {
      // already released
    }
  }
}

/** Formats one SSE event with a JSON payload (and an optional id line). */
export function formatEvent(event: string, data: unknown, id?: string): string {
  return `${id !== undefined ? `id: ${id}\n` : ''}event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
}

/** The keep-alive comment sent every ping interval. */
export const PING = ': ping\n\n';

/** Standard base64 of bytes (chunked to keep String.fromCharCode arguments small). */
export function toBase64(bytes: Uint8Array): string {
  let bin = '';
  const CHUNK = 0x8000;
  for (let i = 0; i < bytes.length; i += CHUNK) {
    bin += String.fromCharCode(...bytes.subarray(i, i + CHUNK));
  }
  return btoa(bin);
}
