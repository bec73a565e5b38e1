#!/usr/bin/env bash
# make cluster: the fleet on a 3-node JetStream cluster on this machine, in
# the tenancy mode of docs/tenancy.md (decentralized JWT auth, an account per
# tenant): the nodes start from deploy/nats/cluster/node-jwt.conf (ports
# from deploy/nats/cluster/env.sh, stores in $DATA/cluster), which includes
# deploy/nats/auth/nats-auth.conf, made here once by `dispatcher auth init`
# when missing. The dispatcher (--replicas 3) and three workers (2 slots
# each) connect with their creds files and all three URLs; one query is
# submitted as tenant demo with that tenant's own creds and followed; then
# everything keeps running until Ctrl-C. Kill a node (its pid is printed)
# to watch the fleet fail over. Logs go to $DATA/cluster/logs.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
DATA=${FLEET_RUN_DATA:-./data}
AUTH=${FLEET_AUTH_DIR:-deploy/nats/auth}
dir="$DATA/cluster"
logs="$dir/logs"
mkdir -p "$logs"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

if [[ ! -f "$AUTH/nats-auth.conf" ]]; then
  echo "==> dispatcher auth init --dir $AUTH (once: keys, the server's auth config, the roles' creds)"
  "$BIN/dispatcher" auth init --dir "$AUTH" >/dev/null
fi
# node-jwt.conf includes ../auth/nats-auth.conf, and nats-server reads an
# include relative to the file: the nodes here start from a copy beside
# $AUTH's nats-auth.conf, wherever $AUTH is.
sed "s|^include ../auth/nats-auth.conf|include nats-auth.conf|" deploy/nats/cluster/node-jwt.conf >"$AUTH/cluster-node.conf"
urls="nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224"
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

for n in 1 2 3; do
  (
    eval "$(deploy/nats/cluster/env.sh "$n" "$dir")"
    mkdir -p "$FLEET_NATS_STORE"
    port_free "$FLEET_NATS_PORT" || { echo "port $FLEET_NATS_PORT is in use"; exit 1; }
    exec "$BIN/nats-server" -c "$AUTH/cluster-node.conf"
  ) >"$logs/nats-$n.log" 2>&1 &
  pids+=($!)
  echo "==> node fleet-nats-$n: nats://127.0.0.1:$((4221 + n)), monitoring http://127.0.0.1:$((8221 + n)) (pid $!)"
done
for p in 4222 4223 4224; do
  for _ in $(seq 1 100); do port_free "$p" || break; sleep 0.1; done
done

# The workers contain their agents (bubblewrap) and refuse to start where
# they cannot; this demo then runs them uncontained, saying so.
if [[ -z "${FLEET_ISOLATION:-}" ]] && ! bwrap --unshare-all --unshare-user --die-with-parent --ro-bind / / --proc /proc --dev /dev true >/dev/null 2>&1; then
  echo "==> agents NOT contained: bubblewrap cannot run here (see docs/contained.md); FLEET_ISOLATION=none for this run"
  export FLEET_ISOLATION=none
fi

export FLEET_STORAGE="file://$DATA" FLEET_LOG_FORMAT=console FLEET_LOG_LEVEL=${FLEET_LOG_LEVEL:-warn} FLEET_NATS_URL=$urls
"$BIN/dispatcher" serve --nats-creds "$AUTH/dispatcher.creds" --replicas 3 --max-concurrency 6 >"$logs/dispatcher.log" 2>&1 &
pids+=($!)
echo "==> dispatcher (pid $!), streams with 3 replicas"
for w in 1 2 3; do
  "$BIN/worker" --nats-creds "$AUTH/worker.creds" --agent-cmd "${FLEET_AGENT_CMD:-$BIN/fleet-standin-agent}" --slots 2 \
    --journal-dir "$dir/journal-$w" --sandbox-dir "$dir/sandboxes-$w" --shutdown-grace 5s >"$logs/worker-$w.log" 2>&1 &
  pids+=($!)
  echo "==> worker $w (pid $!)"
done

creds="$dir/demo.creds"
"$BIN/dispatcher" tenant creds demo --dir "$AUTH" --out "$creds"
echo "==> waiting for the dispatcher to serve"
for _ in $(seq 1 120); do
  "$BIN/dispatcher" ls --nats-creds "$creds" >/dev/null 2>&1 && break
  sleep 0.5
done
id="cluster-$(date +%Y%m%d-%H%M%S)-$RANDOM"
echo "==> submitting demo/$id with tenant demo's creds and following it"
"$BIN/dispatcher" submit --nats-creds "$creds" --id "$id" --follow "${PROMPT:-/standin lines=12 delay=200ms}" || true
echo
echo "The cluster keeps running (Ctrl-C stops everything). Submit more as tenant demo with:"
echo "  FLEET_NATS_URL='$urls' $BIN/dispatcher submit --nats-creds $creds --follow '/standin lines=12 delay=400ms'"
echo "(the operator's creds, every tenant: --nats-creds $AUTH/admin.creds)"
echo "Logs: $logs"
wait
