#!/usr/bin/env bash
# KServe v2 over gRPC against REST with binary tensors, on one server: `sluice bench --grpc` (raw
# contents; its nghttp2 client "h2" and gRPC C++'s "grpc++") and `sluice bench --url --binary` at
# the same closed-loop concurrency, interleaved REST h2 grpc++ grpc++ h2 REST REST h2 grpc++ per
# model, then the medians and their ratios.
# Usage: scripts/grpc-vs-rest.sh [CONNECTIONS] [SECONDS] [MODEL...]
# (default: 64 connections, 5 s, the 16-float identity test model and fashion_mnist; models are
# taken from build/test-models, else models/)
set -euo pipefail
cd "$(dirname "$0")/.."

connections=${1:-64}
seconds=${2:-5}
shift $(( $# < 2 ? $# : 2 ))
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(identity fashion_mnist)
sluice=${SLUICE:-build/sluice}

# One repository holding each model, linked from where it lives.
repository=$(mktemp -d)
for model in "${models[@]}"; do
  for dir in build/test-models models; do
    if [[ -f $dir/$model/config.yaml ]]; then
      ln -s "$PWD/$dir/$model" "$repository/$model"
      break
    fi
  done
  [[ -e $repository/$model ]] || { echo "error: no model '$model' in build/test-models or models" >&2; exit 1; }
done

. scripts/lib/serve.sh
start_server "$sluice" --model-repository "$repository" --grpc-port 0
trap 'kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$work" "$repository"' EXIT

run() {  # run rest|h2|grpc++ MODEL -> requests/s
  local how=$1 model=$2 target
  if [[ $how == rest ]]; then
    target=(--url "http://127.0.0.1:$port")
  else
    target=(--grpc --grpc-client "$how" --url "127.0.0.1:$grpc_port"
            --metrics-url "http://127.0.0.1:$port")
  fi
  "$sluice" bench "${target[@]}" --model "$model" --binary --concurrency "$connections" \
      --duration "$seconds" --warmup 1 --no-results | tail -1 | tee -a "$work/$how-$model.rows" >&2
}

for model in "${models[@]}"; do
  for how in rest h2 grpc++ grpc++ h2 rest rest h2 grpc++; do
    echo -n "$model $how: " >&2
    run "$how" "$model"
  done
done
for model in "${models[@]}"; do
  /usr/bin/python3 - "$model" "$work/rest-$model.rows" "$work/h2-$model.rows" \
      "$work/grpc++-$model.rows" <<'PY'
import statistics, sys
model, rest, h2, grpcpp = sys.argv[1], *sys.argv[2:]
rps = lambda path: [float(line.split()[2]) for line in open(path)]
r, h, g = rps(rest), rps(h2), rps(grpcpp)
m = statistics.median
print(f"{model}: REST binary {m(r):,.0f} requests/s {[round(x) for x in r]}; "
      f"gRPC h2 {m(h):,.0f} {[round(x) for x in h]}, gRPC / REST {m(h) / m(r):.3f}; "
      f"gRPC grpc++ {m(g):,.0f} {[round(x) for x in g]}, gRPC / REST {m(g) / m(r):.3f}")
PY
done
