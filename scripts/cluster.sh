#!/usr/bin/env bash
# make cluster: the fleet on a 3-node JetStream cluster on this machine.
# Starts three nats-server nodes from deploy/nats/cluster/node.conf (ports
# from deploy/nats/cluster/env.sh, stores in $DATA/cluster, the users of
# deploy/nats/accounts.conf), the dispatcher with --replicas 3 and three
# workers (2 slots each) given all three URLs, submits one query and
# follows it, then keeps running until Ctrl-C. Kill a node (its pid is
# printed) to watch the fleet fail over. Logs go to $DATA/cluster/logs.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
DATA=${FLEET_RUN_DATA:-./data}
dir="$DATA/cluster"
logs="$dir/logs"
mkdir -p "$logs"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

# Demo passwords unless the environment has them.
for role in DISPATCHER WORKER PRODUCER SUBSCRIBER CLIENT SYS; do
  var=FLEET_${role}_PASSWORD
  if [[ -z "${!var:-}" ]]; then export "$var=demo-$(tr -dc a-z0-9 </dev/urandom | head -c 12)"; fi
done
urls() { # urls USER PASSWORD: the three nodes' client URLs with credentials
  echo "nats://$1:$2@127.0.0.1:4222,nats://$1:$2@127.0.0.1:4223,nats://$1:$2@127.0.0.1:4224"
}
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

for n in 1 2 3; do
  (
    eval "$(deploy/nats/cluster/env.sh "$n" "$dir")"
    mkdir -p "$FLEET_NATS_STORE"
    port_free "$FLEET_NATS_PORT" || { echo "port $FLEET_NATS_PORT is in use"; exit 1; }
    exec "$BIN/nats-server" -c deploy/nats/cluster/node.conf
  ) >"$logs/nats-$n.log" 2>&1 &
  pids+=($!)
  echo "==> node fleet-nats-$n: nats://127.0.0.1:$((4221 + n)), monitoring http://127.0.0.1:$((8221 + n)) (pid $!)"
done
for p in 4222 4223 4224; do
  for _ in $(seq 1 100); do port_free "$p" || break; sleep 0.1; done
done

export FLEET_STORAGE="file://$DATA" FLEET_LOG_FORMAT=console FLEET_LOG_LEVEL=${FLEET_LOG_LEVEL:-warn}
FLEET_NATS_URL=$(urls dispatcher "$FLEET_DISPATCHER_PASSWORD") \
  "$BIN/dispatcher" serve --replicas 3 --max-concurrency 6 >"$logs/dispatcher.log" 2>&1 &
pids+=($!)
echo "==> dispatcher (pid $!), streams with 3 replicas"
for w in 1 2 3; do
  FLEET_NATS_URL=$(urls worker "$FLEET_WORKER_PASSWORD") \
    "$BIN/worker" --agent-cmd "${FLEET_AGENT_CMD:-$BIN/fleet-standin-agent}" --slots 2 \
    --journal-dir "$dir/journal-$w" --sandbox-dir "$dir/sandboxes-$w" --shutdown-grace 5s >"$logs/worker-$w.log" 2>&1 &
  pids+=($!)
  echo "==> worker $w (pid $!)"
done

client=$(urls client "$FLEET_CLIENT_PASSWORD")
echo "==> waiting for the dispatcher to serve"
for _ in $(seq 1 120); do
  FLEET_NATS_URL=$client "$BIN/dispatcher" ls >/dev/null 2>&1 && break
  sleep 0.5
done
id="cluster-$(date +%Y%m%d-%H%M%S)-$RANDOM"
echo "==> submitting default/$id and following it"
FLEET_NATS_URL=$client "$BIN/dispatcher" submit --id "$id" --follow "${PROMPT:-/standin lines=12 delay=200ms}" || true
echo
echo "The cluster keeps running (Ctrl-C stops everything). Submit more with:"
echo "  FLEET_NATS_URL='$client' $BIN/dispatcher submit --follow '/standin lines=12 delay=400ms'"
echo "Logs: $logs"
wait
