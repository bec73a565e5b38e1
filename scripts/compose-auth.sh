#!/usr/bin/env bash
# compose-auth.sh init | tenant NAME: the NATS JWT set-up for docker-compose.yml.
#   init    `dispatcher auth init` into deploy/compose/auth (the resolver as
#           the containers see it: /auth/jwt), a nats.conf beside it, the
#           directory given to the control plane's user (uid 10002: nats-server
#           and the dispatcher), and a copy of worker.creds, 0600, given to the
#           worker's user (uid 10001) in deploy/compose/worker/.
#   tenant  creds and a token for tenant NAME into deploy/compose/tenants/
#           (NAME.creds, NAME.token), owned by whoever runs this.
# Ownership is set inside a container of the worker image, so it is right
# for the engine's user namespace (rootful or rootless alike).
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${CONTAINER_ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
image=${IMAGE_REPO:-agentfleet}/worker:${IMAGE_TAG:-dev}
disp=bin/image/dispatcher
dir=deploy/compose
[[ -x $disp ]] || { echo "compose-auth: $disp is missing: run make images first" >&2; exit 1; }

# as_root CMD: run a shell command as root in a container of the worker
# image with deploy/compose at /c.
as_root() {
	"$engine" run --rm --user 0 --entrypoint /bin/sh -v "$PWD/$dir:/c:z" "$image" -c "$1"
}

case ${1:-} in
init)
	if [[ -e $dir/auth ]]; then
		echo "compose-auth: $dir/auth exists already (remove it, and the nats-data volume, to start over)" >&2
		exit 1
	fi
	tmp=$dir/auth.new
	rm -rf "$tmp"
	"$disp" auth init --dir "$tmp" --resolver-dir /auth/jwt
	printf '%s\n' '# nats-server for docker-compose.yml: JetStream, JWT auth (nats-auth.conf of auth init)' \
		'listen: 0.0.0.0:4222' 'http: 0.0.0.0:8222' 'max_payload: 1MB' \
		'jetstream { store_dir: /data/nats }' 'include ./nats-auth.conf' > "$tmp/nats.conf"
	chmod 0600 "$tmp/nats.conf"
	mkdir -p "$dir/worker"
	cp "$tmp/worker.creds" "$dir/worker/worker.creds"
	mv "$tmp" "$dir/auth"
	as_root 'chown -R 10002:10002 /c/auth && chmod 0700 /c/auth &&
		chown -R 10001:10001 /c/worker && chmod 0700 /c/worker && chmod 0600 /c/worker/worker.creds'
	echo "compose-auth: $dir/auth (uid 10002) and $dir/worker/worker.creds (uid 10001) ready; next: make compose/up"
	;;
tenant)
	name=${2:?usage: compose-auth.sh tenant NAME}
	mkdir -p "$dir/tenants"
	uid=$(id -u) gid=$(id -g)
	# auth is the control plane's: run the tenant commands as root in a
	# container (the worker image has no dispatcher, so mount ours).
	"$engine" run --rm --user 0 --entrypoint /bin/sh -v "$PWD/$dir:/c:z" -v "$PWD/$disp:/usr/local/bin/dispatcher:ro,z" "$image" -c "
		set -e
		dispatcher tenant creds '$name' --dir /c/auth --out /c/tenants/'$name'.creds
		dispatcher tenant token '$name' --dir /c/auth > /c/tenants/'$name'.token
		chown -R 10002:10002 /c/auth
		chown $uid:$gid /c/tenants/'$name'.creds /c/tenants/'$name'.token
		chmod 0600 /c/tenants/'$name'.creds /c/tenants/'$name'.token"
	echo "compose-auth: $dir/tenants/$name.creds and $name.token"
	;;
*)
	echo "usage: compose-auth.sh init | tenant NAME" >&2
	exit 2
	;;
esac
