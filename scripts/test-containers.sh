#!/usr/bin/env bash
# make test/containers: the fleet in containers (internal/containertest).
# Installs podman, runc and mmdebstrap from Debian when missing, configures
# podman for a host like CI's (runc: crun refuses hybrid cgroups; no default
# rlimits: setting them needs CAP_SYS_RESOURCE), bootstraps a local Debian
# base (no registry needed), builds the images on it under a tag of its own,
# runs the Go test, and removes every image it built (the test removes its
# containers, network and volumes itself).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) != 0 ]]; then
	echo "test/containers: needs root (rootful podman, apt-get)" >&2
	exit 1
fi
missing=()
for p in podman:podman runc:runc mmdebstrap:mmdebstrap; do
	command -v "${p%%:*}" >/dev/null 2>&1 || [[ -x /usr/sbin/${p%%:*} ]] || missing+=("${p##*:}")
done
if ((${#missing[@]})); then
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
conf=/etc/containers/containers.conf
if ! grep -qs '^runtime = "runc"' "$conf" || ! grep -qs '^default_ulimits = \[\]' "$conf"; then
	mkdir -p /etc/containers
	[[ -f $conf ]] && cp "$conf" "$conf.agentfleet-backup"
	cat >"$conf" <<'CONF'
# agentfleet test/containers: runc (crun 1.8 refuses hybrid cgroups) and no
# default rlimits (setting them needs CAP_SYS_RESOURCE on such hosts).
[containers]
default_ulimits = []

[engine]
runtime = "runc"
CONF
fi
tag="ctest$$"
export CONTAINER_ENGINE=podman IMAGE_TAG=$tag
cleanup() {
	for t in worker dispatcher nats; do podman rmi -f "agentfleet/$t:$tag" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
base=${LOCAL_BASE_IMAGE:-localhost/agentfleet/base:bookworm}
start=$SECONDS
if ! podman image exists "$base"; then
	make --no-print-directory images/base LOCAL_BASE_IMAGE="$base"
fi
echo "test/containers: base ready in $((SECONDS - start))s"
start=$SECONDS
make --no-print-directory images BASE_IMAGE="$base"
echo "test/containers: images built in $((SECONDS - start))s"
FLEET_CONTAINER_TAG=$tag go test -tags containers -count=1 -v -timeout 20m ./internal/containertest/
