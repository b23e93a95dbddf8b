#!/usr/bin/env bash
# Soak test: SECONDS (default 600) of mixed traffic against one `sluice serve` on 127.0.0.1, then
# a report of the server's resident memory and open file descriptors.
#
#   scripts/soak.sh [SECONDS] [SLUICE_BINARY] [TEST_MODEL_REPOSITORY]
#
# Traffic, all at once for the whole period:
#   valid     `sluice bench`, closed loop: identity with binary tensors (4 connections) and
#             tiny_cnn with JSON (4 connections);
#   hostile   tools/soak_traffic.py (2 threads): malformed and invalid requests, each expecting
#             its 4xx; clients that disconnect mid-header, mid-body and before their answer.
# RSS is sampled every 10 s; "start" is the sample after the first minute (allocator pools and
# connection buffers warmed up), "end" the last one under traffic. Open descriptors are counted
# idle before the traffic and idle after it. Fails when RSS grows 5% or more, descriptors are
# left open, any valid request failed, or any hostile request got an unexpected answer.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-600}
sluice=${2:-build/sluice}
repository=${3:-build/test-models}
python=${PYTHON:-/usr/bin/python3}
warmup=$((seconds < 120 ? seconds / 4 : 60))

[ -x "$sluice" ] || { echo "error: $sluice not built (make build)" >&2; exit 1; }
if [ ! -f "$repository/identity/model.pt" ] || [ ! -f "$repository/tiny_cnn/model.pt" ]; then
  "$python" tools/export_models.py --test --out "$repository"
fi

. scripts/lib/serve.sh
start_server "$sluice" --model-repository "$repository" --model identity --model tiny_cnn \
  --max-body-bytes 262144 --max-connections 512
url="http://127.0.0.1:$port"
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$server/status"; }
fds() { find "/proc/$server/fd" -mindepth 1 | wc -l; }

fds_before=$(fds)
rss_idle=$(rss_kib)
echo "soak: server pid $server on $url; ${seconds} s of traffic"

"$sluice" bench --url "$url" --model identity --binary --concurrency 4 --duration "$seconds" \
  --warmup 0 --no-results >"$work/bench-identity.txt" 2>&1 &
bench_identity=$!
"$sluice" bench --url "$url" --model tiny_cnn --json --concurrency 4 --duration "$seconds" \
  --warmup 0 --no-results >"$work/bench-tiny_cnn.txt" 2>&1 &
bench_tiny=$!
"$python" tools/soak_traffic.py --port "$port" --seconds "$seconds" --threads 2 \
  >"$work/hostile.txt" 2>&1 &
hostile=$!

rss_start=""
rss_max=0
rss_end=0
elapsed=0
while kill -0 "$hostile" 2>/dev/null; do
  sleep 10
  elapsed=$((elapsed + 10))
  kill -0 "$server" 2>/dev/null || { echo "error: the server died" >&2; cat "$work/server.log" >&2; exit 1; }
  rss=$(rss_kib)
  [ "$elapsed" -le "$seconds" ] || break
  rss_end=$rss
  [ "$rss" -gt "$rss_max" ] && rss_max=$rss
  if [ -z "$rss_start" ] && [ "$elapsed" -ge "$warmup" ]; then rss_start=$rss; fi
  printf '  %4d s  RSS %6d KiB  fds %4d\n' "$elapsed" "$rss" "$(fds)"
done
status=0
wait "$bench_identity" || status=1
wait "$bench_tiny" || status=1
wait "$hostile" || status=1
sleep 2  # Let the last connections close.
fds_after=$(fds)
rss_start=${rss_start:-$rss_end}

echo
echo "== valid traffic"
grep -E '^ *conns|closed' "$work/bench-identity.txt" "$work/bench-tiny_cnn.txt" | sed 's|^.*/bench-||'
echo "== hostile traffic"
cat "$work/hostile.txt"
health=$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/ready")
growth=$(awk -v a="$rss_start" -v b="$rss_end" 'BEGIN { printf "%.2f", (b - a) * 100 / a }')
echo "== server"
echo "RSS: idle $((rss_idle / 1024)) MiB; start (after ${warmup} s) $((rss_start / 1024)) MiB;" \
  "end $((rss_end / 1024)) MiB; peak $((rss_max / 1024)) MiB; growth ${growth}%"
echo "open file descriptors: ${fds_before} idle before, ${fds_after} idle after"
echo "health after the soak: $health"

errors=$(awk '$2 == "closed" && $9 != 0 { bad = 1 } END { print bad + 0 }' \
  "$work/bench-identity.txt" "$work/bench-tiny_cnn.txt")
if [ "$rss_start" -le 0 ] || awk -v g="$growth" 'BEGIN { exit !(g >= 5) }'; then echo "FAIL: RSS grew ${growth}%"; status=1; fi
if [ "$fds_after" -gt "$fds_before" ]; then echo "FAIL: descriptors left open"; status=1; fi
if [ "$errors" != 0 ]; then echo "FAIL: valid requests failed"; status=1; fi
if [ "$health" != 200 ]; then echo "FAIL: not healthy after the soak"; status=1; fi
[ "$status" = 0 ] && echo "soak: PASS" || echo "soak: FAIL"
exit "$status"
