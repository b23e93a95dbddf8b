#!/usr/bin/env bash
# Checks `sluice bench --url` against an independent client: wrk (with a Lua POST script) and
# sluice send the same KServe v2 JSON request at the same concurrency to the same server, one
# after the other, twice each (A B A B); both requests/s and p99 are printed with their ratio.
# Usage: scripts/cross-check.sh [MODEL_REPOSITORY] [MODEL] [CONNECTIONS] [SECONDS]
# (default: the 16-float identity test model, where the server rather than a model is measured)
set -euo pipefail
cd "$(dirname "$0")/.."

repository=${1:-build/test-models}
model=${2:-identity}
connections=${3:-64}
seconds=${4:-10}
sluice=${SLUICE:-build/sluice}
command -v wrk >/dev/null || { echo "error: wrk is not installed (scripts/install-deps.sh)" >&2; exit 1; }

. scripts/lib/serve.sh
start_server "$sluice" --model-repository "$repository" --model "$model"
url="http://127.0.0.1:$port"

# The request body both clients send: random values shaped from the model's metadata.
/usr/bin/python3 - "$url" "$model" >"$work/body.json" <<'PY'
import json, random, sys, urllib.request
url, model = sys.argv[1], sys.argv[2]
meta = json.load(urllib.request.urlopen(f"{url}/v2/models/{model}"))
random.seed(1)
inputs = []
for spec in meta["inputs"]:
    shape = [1] + spec["shape"][1:]
    n = 1
    for d in shape:
        n *= d
    inputs.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"],
                   "data": [round(random.gauss(0, 1), 6) for _ in range(n)]})
print(json.dumps({"inputs": inputs}))
PY
cat >"$work/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$work/body.json", "rb")
wrk.body = f:read("*a")
f:close()
LUA

run_wrk() {
  wrk -t1 -c"$connections" -d"${seconds}s" --latency -s "$work/post.lua" "$url/v2/models/$model/infer" \
    >"$work/wrk.out"
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$work/wrk.out")
  p99=$(awk '$1 == "99%" {v=$2; if (v ~ /us$/) {sub(/us$/, "", v); v/=1000} else if (v ~ /ms$/) {sub(/ms$/, "", v)} else if (v ~ /s$/) {sub(/s$/, "", v); v*=1000}; print v}' "$work/wrk.out")
  echo "$rps $p99"
}
run_sluice() {
  # sluice sends the same body: its own v2 JSON payload from the same metadata and seed would
  # differ in values only, so the wrk body is not needed; sizes match.
  "$sluice" bench --url "$url" --model "$model" --concurrency "$connections" --duration "$seconds" \
    --warmup 1 --json --no-results >"$work/sluice.out"
  awk '$2 == "closed" {print $3, $7}' "$work/sluice.out"
}

echo "server: $url ($model), $connections connections, ${seconds} s per run"
printf "%-8s %-6s %12s %10s\n" client round "requests/s" "p99 ms"
declare -a wr wp sr sp
for round in 1 2; do
  read -r r p < <(run_wrk); wr+=("$r"); wp+=("$p")
  printf "%-8s %-6s %12s %10s\n" wrk "$round" "$r" "$p"
  read -r r p < <(run_sluice); sr+=("$r"); sp+=("$p")
  printf "%-8s %-6s %12s %10s\n" sluice "$round" "$r" "$p"
done
/usr/bin/python3 - "${wr[@]}" "${sr[@]}" "${wp[@]}" "${sp[@]}" <<'PY'
import statistics, sys
v = list(map(float, sys.argv[1:]))
wr, sr, wp, sp = v[0:2], v[2:4], v[4:6], v[6:8]
rr = statistics.mean(sr) / statistics.mean(wr)
pr = statistics.mean(sp) / statistics.mean(wp)
print(f"sluice/wrk: requests/s {rr:.3f}, p99 {pr:.3f} ({'within' if abs(rr - 1) <= 0.1 and abs(pr - 1) <= 0.1 else 'NOT within'} 10%)")
PY
