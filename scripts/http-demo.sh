#!/usr/bin/env bash
# Starts `sluice serve` on 127.0.0.1 (a free port), runs the HTTP concurrency sweep against each
# named model, prints the tables and plot paths, and stops the server by its PID.
# Usage: scripts/http-demo.sh SLUICE_BINARY MODEL_REPOSITORY MODEL... [-- BENCH_FLAGS...]
set -euo pipefail

sluice=$1
repository=$2
shift 2
models=()
while [[ $# -gt 0 && $1 != "--" ]]; do
  models+=("$1")
  shift
done
[[ $# -gt 0 ]] && shift
bench_flags=("$@")

log=$(mktemp)
"$sluice" serve --model-repository "$repository" --port 0 >"$log" 2>&1 &
server=$!
cleanup() {
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -f "$log"
}
trap cleanup EXIT

port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's|^Sluice listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$log")
  [[ -n $port ]] && break
  if ! kill -0 "$server" 2>/dev/null; then
    cat "$log" >&2
    echo "error: the server exited before listening" >&2
    exit 1
  fi
  sleep 0.1
done
[[ -n $port ]] || { cat "$log" >&2; echo "error: the server did not start" >&2; exit 1; }
echo "server pid $server on http://127.0.0.1:$port"

for model in "${models[@]}"; do
  "$sluice" bench --url "http://127.0.0.1:$port" --model "$model" "${bench_flags[@]}"
done
