#!/usr/bin/env bash
# The served figure against the in-process engine, interleaved: each round runs `sluice bench
# --url` against `sluice serve` (binary v2 tensors, N connections), then the in-process batched
# pipeline with N single-sample clients on the same model config while the server is idle; the
# order flips every round. Prints samples/s of both per round and the median of the ratios.
# Usage: scripts/http-vs-inprocess.sh MODEL [CONNECTIONS] [SECONDS] [ROUNDS] [IN_PROCESS_ITERS]
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:?model name}
connections=${2:-64}
seconds=${3:-10}
rounds=${4:-3}
iters=${5:-500}
repository=${MODELS:-models}
sluice=${SLUICE:-build/sluice}

. scripts/lib/serve.sh
start_server "$sluice" --model-repository "$repository" --model "$model"

http() {
  "$sluice" bench --url "http://127.0.0.1:$port" --model "$model" --concurrency "$connections" \
    --duration "$seconds" --warmup 2 --binary --no-results | awk '$2 == "closed" {print $4, $10}'
}
inprocess() {
  "$sluice" bench --in-process --model-repository "$repository" --model "$model" \
    --concurrency "$connections" --iters "$iters" --no-results |
    awk '/^Throughput/ {t=$4} /^Batches:/ {b=$5} END {print t, b}'
}

ratios=()
for round in $(seq 1 "$rounds"); do
  if (( round % 2 == 1 )); then
    read -r h hb < <(http); read -r p pb < <(inprocess)
  else
    read -r p pb < <(inprocess); read -r h hb < <(http)
  fi
  ratio=$(awk -v h="$h" -v p="$p" 'BEGIN {printf "%.3f", h / p}')
  ratios+=("$ratio")
  echo "round $round: http $h samples/s (mean batch $hb), in-process $p samples/s (mean batch $pb), ratio $ratio"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {m = NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "median http/in-process over %d rounds: %.3f\n", NR, m}'
