#!/usr/bin/env bash
# make run: one query end to end on this machine. Starts a NATS server (built
# from the pinned nats-server module) into a temporary store, the dispatcher
# and one worker with local storage (./data) and the local sandbox, submits a
# query, follows it to its result, then says where the transcript and the
# status record are. Uses `claude` when it is installed and ANTHROPIC_API_KEY
# or CLAUDE_CODE_OAUTH_TOKEN is set; otherwise says so and uses the bundled
# stand-in agent. The logs stay in $DATA/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
DATA=${FLEET_RUN_DATA:-./data}
PROMPT=${PROMPT:-"Say hello to the fleet and explain in one sentence what you are."}
mkdir -p "$DATA"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/agentfleet-run.XXXXXX")
logs="$DATA/logs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$logs"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=${FLEET_RUN_PORT:-14222}
while ! port_free "$port"; do port=$((port + 1)); done
url="nats://127.0.0.1:$port"

echo "==> starting NATS (JetStream) on $url (a temporary store, removed at exit)"
"$BIN/nats-server" -a 127.0.0.1 -p "$port" -js -sd "$tmp/nats" >"$logs/nats.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do port_free "$port" || break; sleep 0.1; done
if port_free "$port"; then echo "NATS did not start:"; cat "$logs/nats.log"; exit 1; fi

if command -v claude >/dev/null 2>&1 && [[ -n "${ANTHROPIC_API_KEY:-}${CLAUDE_CODE_OAUTH_TOKEN:-}" ]]; then
  agent="claude"
  echo "==> agent: claude ($(command -v claude))"
else
  agent="$BIN/fleet-standin-agent"
  echo "==> agent: the bundled STAND-IN agent (no model is called)."
  echo "    To run real Claude Code: install the claude CLI and set ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN from 'claude setup-token'), then 'make run' again."
  echo "    The stand-in takes directives as its prompt, e.g. PROMPT='/standin lines=30 delay=1s' make run (see README.md)."
fi

# The worker contains its agents (bubblewrap) and refuses to start where it
# cannot; this demo then runs them uncontained, saying so.
if [[ -z "${FLEET_ISOLATION:-}" ]] && ! bwrap --unshare-all --unshare-user --die-with-parent --ro-bind / / --proc /proc --dev /dev true >/dev/null 2>&1; then
  echo "==> agents NOT contained: bubblewrap cannot run here (see docs/contained.md); FLEET_ISOLATION=none for this run"
  export FLEET_ISOLATION=none
fi

export FLEET_NATS_URL="$url" FLEET_STORAGE="file://$DATA" FLEET_LOG_FORMAT=console FLEET_LOG_LEVEL=${FLEET_LOG_LEVEL:-warn}
echo "==> starting the dispatcher and a worker (logs in $logs)"
"$BIN/dispatcher" serve --max-concurrency 4 >"$logs/dispatcher.log" 2>&1 &
pids+=($!)
"$BIN/worker" --agent-cmd "$agent" --slots 2 --workspace-allow-file --journal-dir "$DATA/journal" --sandbox-dir "$DATA/sandboxes" \
  --shutdown-grace 5s >"$logs/worker.log" 2>&1 &
pids+=($!)

id="run-$(date +%Y%m%d-%H%M%S)-$RANDOM"
echo "==> submitting query default/$id and following it"
echo
set +e
for _ in $(seq 1 50); do
  "$BIN/dispatcher" status "$id" >/dev/null 2>&1
  rc=$?
  [[ $rc -eq 3 ]] && break   # the dispatcher answers (not found yet)
  sleep 0.2
done
"$BIN/dispatcher" submit --id "$id" --follow -- "$PROMPT"
rc=$?
set -e
echo
transcript="$DATA/queries/default/$id/transcript.ndjson"
for _ in $(seq 1 100); do [[ -f "$transcript" ]] && break; sleep 0.1; done
echo "==> query finished (exit code $rc)"
echo "    transcript (raw stream-json, one line per agent message): $transcript"
echo "    status record: $DATA/status/default/$id.json"
echo "    logs: $logs"
echo "    (this run's NATS server and its temporary store are gone; on a running fleet, replay a query with: bin/dispatcher tail <id>)"

# A workspace run: the agent works in a checkout of a small local
# repository, and what it changed comes back as a file list, a diff and a
# git bundle.
if [[ $rc -eq 0 ]]; then
  repo="$tmp/demo-repo"
  git init -q -b main "$repo/src"
  printf '# demo\n' >"$repo/src/README.md"
  printf 'old\n' >"$repo/src/old.txt"
  printf 'package main\n\nfunc main() {}\n' >"$repo/src/main.go"
  git -C "$repo/src" add -A
  git -C "$repo/src" -c user.name=demo -c user.email=demo@example.invalid commit -q -m "demo repository"
  git clone -q --bare "$repo/src" "$repo/demo.git"
  wsid="ws-$id"
  if [[ "$agent" == "claude" ]]; then
    wsprompt="Append a line 'Edited by the fleet.' to README.md, delete old.txt and add a file notes/todo.txt with one line."
    wsflags=(--permission-mode acceptEdits)
  else
    wsprompt="/standin append=README.md rm=old.txt commit=stand-in_commit append=notes/todo.txt binary=logo.bin"
    wsflags=()
  fi
  echo
  echo "==> a workspace run: submitting default/$wsid on file://$repo/demo.git"
  echo
  set +e
  "$BIN/dispatcher" submit --id "$wsid" --follow --repo "file://$repo/demo.git" "${wsflags[@]}" -- "$wsprompt"
  rc=$?
  set -e
  echo
  echo "==> workspace run finished (exit code $rc); its changed files (dispatcher diff $wsid --stat):"
  "$BIN/dispatcher" diff "$wsid" --stat | sed 's/^/    /' || true
  echo "    diff (applies with git apply to start_sha): $DATA/queries/default/$wsid/workspace/diff.patch"
  echo "    bundle (git bundle verify / git fetch it):  $DATA/queries/default/$wsid/workspace/bundle"
  echo "    first lines of the diff (dispatcher diff $wsid):"
  "$BIN/dispatcher" diff "$wsid" | head -n 12 | sed 's/^/      /' || true
fi
# A session: two turns in one agent process, then end (docs/sessions.md).
if [[ $rc -eq 0 ]]; then
  sid="session-$id"
  echo
  echo "==> a two-turn session: submit --session default/$sid, send a second input, end it, then tail it"
  echo
  set +e
  "$BIN/dispatcher" submit --session --id "$sid" -- "First turn: say hello." >/dev/null &&
    "$BIN/dispatcher" send "$sid" "Second turn: what did I say first?" &&
    "$BIN/dispatcher" send "$sid" --end &&
    "$BIN/dispatcher" tail "$sid"
  rc=$?
  set -e
  echo
  echo "==> session finished (exit code $rc); it ran two turns in one agent process."
  echo "    checkpoint (Claude Code's transcript, last input applied): $DATA/queries/default/$sid/session/"
fi
if [[ $rc -ne 0 ]]; then
  echo "---- worker log ($logs/worker.log) ----"; tail -n 30 "$logs/worker.log"
  echo "---- dispatcher log ($logs/dispatcher.log) ----"; tail -n 30 "$logs/dispatcher.log"
fi
exit $rc
