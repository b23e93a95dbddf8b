#!/usr/bin/env bash
# Installs everything Sluice needs to build, test, export its models and benchmark on Debian 12:
# Debian packages (toolchain and C++ libraries), then the git-ignored .venv with the exactly pinned
# PyPI packages of requirements.txt (PyTorch 2.11, whose libtorch the C++ build links).
# Idempotent: apt runs only when a package is missing, pip only when requirements.txt changed
# since the venv was last made (a stamp in .venv holds its hash).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  # Toolchain.
  build-essential cmake make pkg-config git
  # Python for the venv; its headers, which torch.compile and AOTInductor compile against.
  python3 python3-venv python3-dev
  # The certificate authorities HTTPS downloads (XGrammar's source below) are checked against.
  ca-certificates
  # Serving and codec libraries.
  libboost-dev libboost-system-dev libsimdjson-dev libyaml-cpp-dev libcli11-dev
  libspdlog-dev libfmt-dev libturbojpeg0-dev libspng-dev
  # KV events for cache-aware routers: ZeroMQ sockets and msgpack payloads.
  libzmq3-dev libmsgpack-cxx-dev
  # The tokenizer's pre-tokenizer regular expressions (Unicode classes, look-ahead).
  libpcre2-dev
  # WordPiece (BERT's tokenizer): Unicode character properties, NFD and lowercasing.
  libicu-dev
  # The KServe v2 gRPC service and client: gRPC C++, protobuf, and their code generators.
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # HTTP/2 framing for the gRPC benchmark's lean client.
  libnghttp2-dev
  # Tests and benchmarks; nginx-light answers the fixed response the request-path benchmark
  # holds Sluice's HTTP front against (benchmarks/request_path.py starts its own, on loopback).
  libgtest-dev libgmock-dev libbenchmark-dev wrk nginx-light
  # Fuzzing (libFuzzer) and the thread-safety analysis: clang and its runtime libraries.
  clang libclang-rt-dev
  # The Fashion-MNIST data set the fashion_mnist model is trained and calibrated on.
  dataset-fashion-mnist
  # unzip, to read AOTInductor packages (.pt2 files are zip archives) in the tests.
  unzip
  # Headless Chromium: the tests render every report.html in it and check it loads nothing;
  # chromium-driver (WebDriver) lets Selenium drive the console's browser tests.
  chromium chromium-driver
  # The console's charts, markdown and code highlighting, embedded in the binary at build time.
  libjs-chart.js libjs-marked libjs-highlight.js
  # Deployment: the OCI image (a Debian base from Debian's archive, built and run without a
  # daemon) and the replicas' load balancer.
  mmdebstrap podman buildah uidmap haproxy
  # TorchServe's frontend (a Java server), one of the peers benchmarks/vision_peers.py runs.
  openjdk-17-jre-headless
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  SUDO="sudo"
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# A source distribution from PyPI into the git-ignored .deps/, checked by its SHA-256:
# fetch_pinned FILE URL SHA256 (skipped when FILE is there with that hash).
fetch_pinned() {
  local file=$1 url=$2 sha=$3
  if [ -f "$file" ] && echo "$sha  $file" | sha256sum -c --quiet - 2>/dev/null; then
    echo "install-deps: $file present"
    return
  fi
  echo "install-deps: downloading $file"
  mkdir -p .deps
  /usr/bin/python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
    "$url" "$file.part"
  echo "$sha  $file.part" | sha256sum -c --quiet - ||
    { echo "install-deps: $file has the wrong SHA-256" >&2; rm -f "$file.part"; exit 1; }
  mv "$file.part" "$file"
}

# XGrammar's C++ library (constrained decoding for response_format): CMake builds the library
# from its source distribution (cmake/xgrammar.cmake). Debian has no grammar engine for token
# masks, and XGrammar is the one vLLM, SGLang and TensorRT-LLM use.
fetch_pinned .deps/xgrammar-0.2.8.tar.gz \
  https://files.pythonhosted.org/packages/03/0f/29f521535729be740779c2c98b630ef6607cf28be9b669895dd2b821ff63/xgrammar-0.2.8.tar.gz \
  8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80

# llama.cpp's own converter (convert_hf_to_gguf.py, with its conversion/ package and gguf-py),
# from llama-cpp-python's source distribution (the version requirements.txt pins): the tests
# convert Hugging Face checkpoints to GGUF with it, as users do.
LLAMA_CPP_SDIST=.deps/llama_cpp_python-0.3.36.tar.gz
fetch_pinned "$LLAMA_CPP_SDIST" \
  https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz \
  832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
if [ ! -f .deps/llama.cpp/convert_hf_to_gguf.py ] || [ "$LLAMA_CPP_SDIST" -nt .deps/llama.cpp ]; then
  rm -rf .deps/llama.cpp
  mkdir -p .deps/llama.cpp
  tar -xzf "$LLAMA_CPP_SDIST" -C .deps/llama.cpp --strip-components=3 \
    llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py \
    llama_cpp_python-0.3.36/vendor/llama.cpp/conversion \
    llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py
fi

# The venv is made with Debian's Python (not whatever python3 comes first on PATH), so a new
# machine and CI get the same interpreter.
VENV=.venv
# llama-cpp-python's llama.cpp is built for this CPU without its AMX backend: on Intel CPUs with
# AMX (Sapphire Rapids and later) that backend segfaults in ggml_backend_amx_mul_mat on the test
# models (llama.cpp issue 20824), and the reference must be right, not fast. -mno-amx-* win over
# GGML_NATIVE's -march=native whatever their order.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
LLAMA_CPP_CMAKE_ARGS="-DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'"
stamp="$VENV/.requirements.sha256"
want=$( (cat requirements.txt; echo "$LLAMA_CPP_CMAKE_ARGS") | sha256sum | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "install-deps: $VENV matches requirements.txt"
  exit 0
fi
echo "install-deps: installing requirements.txt into $VENV (about 2.8 GB to download)"
start=$(date +%s)
[ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
CMAKE_ARGS="$LLAMA_CPP_CMAKE_ARGS" "$VENV/bin/python" -m pip install --quiet \
  --disable-pip-version-check --no-input --no-deps -r requirements.txt
# A venv made before the flags above holds a llama.cpp built with AMX: built again without it.
if "$VENV/bin/python" - <<'PY'
import sys
import llama_cpp
sys.exit(0 if b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info() else 1)
PY
then
  echo "install-deps: rebuilding llama-cpp-python without llama.cpp's AMX backend"
  CMAKE_ARGS="$LLAMA_CPP_CMAKE_ARGS" "$VENV/bin/python" -m pip install --quiet \
    --disable-pip-version-check --no-input --no-deps --force-reinstall --no-cache-dir \
    "$(grep '^llama-cpp-python==' requirements.txt)"
fi
echo "$want" >"$stamp"
echo "install-deps: $VENV ready in $(( $(date +%s) - start )) s"
