// Minimal Node typings for the tests that run a real `sh` (the project's
// typecheck uses Workers types only, which do not describe Node built-ins).

declare module 'node:child_process' {
  export function spawnSync(
    command: string,
    args: string[],
    options?: { encoding?: 'utf8'; input?: string },
  ): { status: number | null; stdout: string; stderr: string };
}

declare const process: { execPath: string };
