#!/usr/bin/env bash
# The end of `make demo`: one server on 127.0.0.1 (a free port) with the image models and the
# language model; the HTTP concurrency sweep against each image model (scripts/http-demo.sh), the
# streamed chat and the short LLM bench (scripts/llm-chat-demo.sh), all against it; the merged
# report of RESULTS_DIR; then the console's address. From a terminal the server stays up, with
# that traffic in the console's dashboard, until Ctrl-C; otherwise it stops by its PID at once.
# Usage: scripts/console-demo.sh SLUICE_BINARY MODEL_REPOSITORY PYTHON RESULTS_DIR LLM_MODEL
#          IMAGE_MODEL... [-- BENCH_FLAGS...]
set -euo pipefail

sluice=$1
repository=$2
python=$3
results=$4
llm=$5
shift 5
images=()
while [[ $# -gt 0 && $1 != "--" ]]; do
  images+=("$1")
  shift
done
[[ $# -gt 0 ]] && shift
bench_flags=("$@")
here=$(dirname "$0")

. "$here/lib/serve.sh"
only=(--model "$llm")
for model in "${images[@]}"; do only+=(--model "$model"); done
start_server "$sluice" --model-repository "$repository" "${only[@]}" --model-control
url="http://127.0.0.1:$port"
echo "server pid $server on $url"

SLUICE_URL=$url "$here/http-demo.sh" "$sluice" "$repository" "${images[@]}" -- "${bench_flags[@]}"
SLUICE_URL=$url "$here/llm-chat-demo.sh" "$sluice" "$repository" "$llm" "$python" "$results"
"$sluice" report "$results" --output "$results/report.html"

echo
echo "report:  $results/report.html"
echo "console: $url/  (dashboard, try a model, chat, bench)"
if [[ -t 0 && -t 1 ]]; then
  echo "The server keeps running for the console; Ctrl-C stops it."
  trap 'echo; echo "stopping the server (pid $server)"' INT
  wait "$server" || true
fi
