#!/usr/bin/env bash
# Fashion-MNIST test accuracy of one precision of the fashion_mnist model, through a real server:
# a scratch repository holds fashion_mnist's files with `precision:` set to PRECISION (so the
# server loads that AOTInductor package), `sluice serve` runs on 127.0.0.1, and
# tools/fashion_accuracy.py sends the 10,000 test images to /predictions/fashion_mnist and checks
# the accuracy is within TOLERANCE points of the fp32 accuracy recorded at training.
# Usage: scripts/fashion-accuracy.sh SLUICE_BINARY MODEL_REPOSITORY PRECISION [TOLERANCE]
set -euo pipefail

sluice=$1
repository=$2
precision=$3
tolerance=${4:-1.0}
python=${PYTHON:-.venv/bin/python}

repo=$(mktemp -d)
mkdir "$repo/fashion_mnist"
for f in "$repository"/fashion_mnist/*; do ln -s "$(realpath "$f")" "$repo/fashion_mnist/"; done
rm "$repo/fashion_mnist/config.yaml"
# The precision pinned; precision: auto's record of its choice (precision_auto:, indented lines
# under it) dropped with it.
sed -e "s/^precision: .*/precision: $precision/" \
  -e '/^precision_auto:/,/^[^ ]/{/^precision_auto:/d;/^ /d}' \
  "$repository/fashion_mnist/config.yaml" >"$repo/fashion_mnist/config.yaml"

. "$(dirname "$0")/lib/serve.sh"
start_server "$sluice" --model-repository "$repo"
trap 'kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$work" "$repo"' EXIT
"$python" tools/fashion_accuracy.py --url "http://127.0.0.1:$port" --models "$repo" \
  --tolerance "$tolerance" --label "$precision"
