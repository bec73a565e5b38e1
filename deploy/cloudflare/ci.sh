#!/usr/bin/env bash
# CI for the sandbox bridge Worker: installs the locked npm dependencies,
# typechecks, and runs the vitest suite (the Sandbox SDK is mocked; no
# Cloudflare account, Docker or network beyond the npm registry is needed).
# Called from the top-level `make test`. Needs Node >= 20.19 and npm; with a
# Node older than 22 it runs on Node 22 from the npm package node@22.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "deploy/cloudflare/ci.sh: node and npm are required (Node >= 20.19)" >&2
  exit 1
fi
if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=19)?0:1)'; then
  echo "deploy/cloudflare/ci.sh: Node >= 20.19 is required, found $(node --version)" >&2
  exit 1
fi
# The bridge's packages (wrangler, workerd, vitest) declare node >= 22; on an
# older Node npm prints an EBADENGINE warning per package. Use Node 22 from
# the npm package node@22, installed once into the git-ignored .tools/.
NODE22_VERSION=22.23.3
node22=../../.tools/node22
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0])>=22?0:1)'; then
  if [[ "$("$node22/node_modules/.bin/node" --version 2>/dev/null)" != "v$NODE22_VERSION" ]]; then
    echo "== bridge: installing Node $NODE22_VERSION (npm package node@$NODE22_VERSION) into .tools/node22"
    npm install --prefix "$node22" --no-audit --no-fund --loglevel=error "node@$NODE22_VERSION" >/dev/null
  fi
  PATH="$(cd "$node22/node_modules/.bin" && pwd):$PATH"
  export PATH
fi

# Install exactly package-lock.json. Install scripts are skipped: the tests
# need none of them (esbuild and workerd ship their binaries as packages).
# Skip the install when node_modules already matches the lockfile.
stamp=node_modules/.agentfleet-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  npm ci --no-audit --no-fund --ignore-scripts
  echo "$want" > "$stamp"
fi

echo "== bridge: typecheck (tsc --noEmit)"
npm run --silent typecheck

echo "== bridge: tests (vitest run)"
report=$(mktemp)
trap 'rm -f "$report"' EXIT
status=0
npx vitest run --reporter=default --reporter=json --outputFile.json="$report" || status=$?
node -e '
  const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  console.log(`bridge: ${r.numPassedTests} passed, ${r.numFailedTests} failed`);
' "$report" || true
exit "$status"
