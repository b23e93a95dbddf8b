#!/usr/bin/env bash
# Runs the libFuzzer targets (built by the `fuzz` CMake preset with clang, ASan and UBSan).
#
#   scripts/fuzz.sh [SECONDS] [TARGET ...]
#
# Each target runs SECONDS (default 60) starting from its seed corpus in fuzz/corpus/<target>;
# what it learns goes to build-fuzz/corpus/<target> (the seeds in the repository stay as they are),
# crashes to build-fuzz/artifacts/, logs to build-fuzz/logs/. FUZZ_JOBS targets run at once
# (default 1). Ends with one line per target: executions, corpus size, coverage, result; exits 1
# when any target found a crash, a leak or a hang.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(v2_json v2_binary base64 image config http)
jobs=${FUZZ_JOBS:-1}
out=build-fuzz

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)" --target "${targets[@]/%/_fuzzer}"
mkdir -p "$out/logs" "$out/artifacts"

run_one() {
  local target=$1
  local extra=()
  # The server frees memory on its own threads after the connection closes, which libFuzzer's
  # per-input leak check takes for leaks (and spends most of its time on); the ASan test run
  # checks the server for leaks instead.
  [ "$target" = http ] && extra+=(-detect_leaks=0)
  mkdir -p "$out/corpus/$target"
  "$out/${target}_fuzzer" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$target-" "${extra[@]}" \
    "$out/corpus/$target" "fuzz/corpus/$target" >"$out/logs/$target.log" 2>&1
}

pids=()
status=0
for target in "${targets[@]}"; do
  run_one "$target" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done

printf '%-10s %8s %12s %8s %8s %s\n' target seconds executions corpus edges result
for target in "${targets[@]}"; do
  log="$out/logs/$target.log"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  edges=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(find "$out/corpus/$target" -type f | wc -l)
  result=ok
  grep -qE '^==[0-9]+==ERROR|^SUMMARY|deadly signal|ALARM: working on the last Unit' "$log" && result="FAILED (see $log)"
  printf '%-10s %8s %12s %8s %8s %s\n' "$target" "$seconds" "${runs:-?}" "$corpus" "${edges:-?}" "$result"
done
exit $status
