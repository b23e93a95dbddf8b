#!/usr/bin/env bash
# Starts `sluice serve` on 127.0.0.1 (a free port), runs the HTTP concurrency sweep against each
# named model, prints the tables and plot paths, and stops the server by its PID. With SLUICE_URL
# (http://127.0.0.1:PORT), the server already running there is used instead (and left running).
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

. "$(dirname "$0")/lib/serve.sh"
only=()
for model in "${models[@]}"; do only+=(--model "$model"); done
use_or_start_server "$sluice" --model-repository "$repository" "${only[@]}"

for model in "${models[@]}"; do
  "$sluice" bench --url "http://127.0.0.1:$port" --model "$model" "${bench_flags[@]}"
done
