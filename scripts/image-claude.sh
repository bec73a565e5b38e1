#!/usr/bin/env bash
# image-claude.sh OUT VERSION: put the pinned Claude Code executable at OUT
# for the worker image. Claude Code 2.1 ships as a native executable in a
# per-platform npm package (@anthropic-ai/claude-code-linux-x64 and so on),
# so the image needs neither Node nor npm: we take the executable from
#   1. the package in .tools/claude (what `make test` installs) when it is
#      the pinned version, else
#   2. `npm pack` of the platform package from the npm registry (npm checks
#      the tarball's integrity against the registry's metadata).
set -euo pipefail
out=$1 version=$2
case "$(go env GOARCH)" in
amd64) plat=linux-x64 ;;
arm64) plat=linux-arm64 ;;
*) echo "image-claude: no Claude Code package for GOARCH $(go env GOARCH)" >&2; exit 1 ;;
esac
pkg="@anthropic-ai/claude-code-$plat"
stamp="$out.version"
if [[ -x $out && "$(cat "$stamp" 2>/dev/null)" == "$pkg@$version" ]]; then
	exit 0
fi
local_pkg=".tools/claude/node_modules/$pkg"
if [[ -f $local_pkg/package.json ]] && grep -q "\"version\": \"$version\"" "$local_pkg/package.json"; then
	cp -f "$local_pkg/claude" "$out.tmp"
else
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd "$tmp" && npm pack --silent "$pkg@$version" >/dev/null)
	tar -xzf "$tmp"/*.tgz -C "$tmp" package/claude
	mv "$tmp/package/claude" "$out.tmp"
fi
chmod 0755 "$out.tmp"
"$out.tmp" --version | grep -q "^$version" || { echo "image-claude: $out.tmp is not Claude Code $version" >&2; exit 1; }
mv -f "$out.tmp" "$out"
echo "$pkg@$version" > "$stamp"
