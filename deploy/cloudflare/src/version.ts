// What the bridge is and supports, for the Go worker (GET /v1/version): a
// worker asks once and refuses Cloudflare runs against a bridge that lacks
// what it uses, naming both versions. Keep BRIDGE_VERSION equal to
// package.json's version and to sandbox.BridgeVersion in the Go worker of
// the same release (pkg/sandbox/cloudflare_version.go).

/** This bridge's version; the first with GET /v1/version is 0.2.0. */
export const BRIDGE_VERSION = '0.2.0';

/**
 * What this bridge supports beyond the create/delete routes:
 * proc (start, stream, kill, status), file (PUT/GET), stdin (interactive
 * stdin for sessions), model (the metered model egress and its /model
 * routes).
 */
export const CAPABILITIES: readonly string[] = ['proc', 'file', 'stdin', 'model'];

/** The body of GET /v1/version. */
export function versionBody(): { version: string; capabilities: string[] } {
  return { version: BRIDGE_VERSION, capabilities: [...CAPABILITIES] };
}
