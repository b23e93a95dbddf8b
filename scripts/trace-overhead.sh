#!/usr/bin/env bash
# What request tracing costs: two `sluice serve` of the same model side by side, one untraced and
# one with `--trace` at SAMPLE_RATE, measured in turn with `sluice bench --url` (closed loop, JSON)
# in the order off on on off off on ..., then the medians and their ratio. The traced server's
# file is checked to be complete (no request dropped).
# Usage: [TRACE_DIR=DIR] scripts/trace-overhead.sh [CONNECTIONS] [SECONDS] [ROUNDS] [SAMPLE_RATE] [MODEL]
# (TRACE_DIR: where the trace file goes, default a scratch folder under $TMPDIR; removed after)
# (default: 64 connections, 5 s, 3 rounds of off-on-on-off, rate 1, the 16-float identity test
# model from build/test-models)
set -euo pipefail
cd "$(dirname "$0")/.."

connections=${1:-64}
seconds=${2:-5}
rounds=${3:-3}
rate=${4:-1}
model=${5:-identity}
sluice=${SLUICE:-build/sluice}
[[ -f build/test-models/$model/config.yaml ]] || { echo "error: no build/test-models/$model" >&2; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

start() {  # start NAME ARGS... -> sets port_NAME
  local name=$1
  shift
  "$sluice" serve --port 0 --model-repository build/test-models --model "$model" "$@" \
      >"$work/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
  local p=""
  for _ in $(seq 1 600); do
    p=$(sed -n 's|^Sluice listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$work/$name.log")
    [[ -n $p ]] && break
    sleep 0.1
  done
  [[ -n $p ]] || { cat "$work/$name.log" >&2; echo "error: server $name did not start" >&2; exit 1; }
  eval "port_$name=$p"
}
start off
trace_dir=${TRACE_DIR:-$work}
trace="$trace_dir/sluice-trace-$$.json"
start on --trace "$trace" --trace-sample-rate "$rate" --trace-max-bytes 16GB

run() {  # run off|on -> appends requests/s to $work/NAME.rps
  local name=$1 port_var="port_$1"
  "$sluice" bench --url "http://127.0.0.1:${!port_var}" --model "$model" \
      --concurrency "$connections" --duration "$seconds" --warmup 1 --no-results \
      | tail -1 | tee -a "$work/$name.rows" | awk '{print $3}' >>"$work/$name.rps"
  echo "$name: $(tail -1 "$work/$name.rows")" >&2
}

for ((r = 0; r < rounds; ++r)); do
  for name in off on on off; do run "$name"; done
done

median() { sort -g "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
off=$(median "$work/off.rps")
on=$(median "$work/on.rps")
kill -TERM "$pid_on"
wait "$pid_on" || true
traced=$(sed -n 's|^trace: \([0-9]*\) request(s) in .*|\1|p' "$work/on.log")
echo "untraced requests/s: $(paste -sd' ' "$work/off.rps") -> median $off"
echo "traced (rate $rate) requests/s: $(paste -sd' ' "$work/on.rps") -> median $on"
echo "traced/untraced: $(awk -v a="$on" -v b="$off" 'BEGIN {printf "%.3f", a / b}')"
echo "trace file: $(du -h "$trace" | cut -f1) in $trace_dir, ${traced:-?} requests traced"
if grep -q "dropped" "$work/on.log"; then
  grep "dropped" "$work/on.log" >&2
  echo "warning: the trace dropped requests: the traced figure is too kind" >&2
fi
python3 -c "import json, sys; json.load(open(sys.argv[1]))" "$trace" &&
  echo "trace file: valid JSON"
rm -f "$trace"
