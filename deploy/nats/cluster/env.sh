#!/usr/bin/env bash
# Prints the FLEET_NATS_* variables of node N (1, 2 or 3) of a cluster on
# one host, for deploy/nats/cluster/node.conf:
#   eval "$(deploy/nats/cluster/env.sh 1 ./data/cluster)"
#   nats-server -c deploy/nats/cluster/node.conf
# Node N listens on 127.0.0.1: client 4221+N, monitoring 8221+N, routes 6221+N,
# and keeps its store in DIR/nats-N (DIR defaults to ./data/cluster).
set -euo pipefail
n=${1:?usage: env.sh N [DIR]}
dir=${2:-./data/cluster}
case $n in 1|2|3) ;; *) echo "env.sh: N must be 1, 2 or 3" >&2; exit 2 ;; esac
# Absolute: nats-server reads a variable's value as config, where a
# relative path ("./data") does not parse.
mkdir -p "$dir/nats-$n"
dir=$(cd "$dir" && pwd)
cat <<VARS
export FLEET_NATS_NAME=fleet-nats-$n
export FLEET_NATS_HOST=127.0.0.1
export FLEET_NATS_PORT=$((4221 + n))
export FLEET_NATS_HTTP_PORT=$((8221 + n))
export FLEET_NATS_CLUSTER_PORT=$((6221 + n))
export FLEET_NATS_STORE=$dir/nats-$n
export FLEET_NATS_ROUTE_1=nats-route://127.0.0.1:6222
export FLEET_NATS_ROUTE_2=nats-route://127.0.0.1:6223
export FLEET_NATS_ROUTE_3=nats-route://127.0.0.1:6224
VARS
