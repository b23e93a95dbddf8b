#!/usr/bin/env bash
# Installs every Debian 12 package Sluice needs to build, test, export its models and benchmark.
# Idempotent: packages already present are not touched, and apt runs only when one is missing.
set -euo pipefail

PACKAGES=(
  # Toolchain.
  build-essential cmake make pkg-config git
  # libtorch 1.13 (C++), with OpenBLAS as the system BLAS: the reference BLAS Debian installs by
  # default makes small-model fp32 inference 2-5x slower.
  libtorch-dev libopenblas0 libopenblas-dev
  # Model export tools (Debian's Python only).
  python3 python3-torch python3-torchvision python3-numpy python3-pil
  # Serving and codec libraries.
  libboost-dev libboost-system-dev libsimdjson-dev libyaml-cpp-dev libcli11-dev
  libspdlog-dev libfmt-dev libturbojpeg0-dev libspng-dev
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev wrk
  # Fuzzing (libFuzzer) and the thread-safety analysis: clang and its runtime libraries.
  clang libclang-rt-dev
  # The Fashion-MNIST data set the fashion_mnist model is trained on.
  dataset-fashion-mnist
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
