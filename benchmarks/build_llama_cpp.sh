#!/usr/bin/env bash
# Builds llama.cpp's llama-server and llama-bench, the peer the language-model benchmarks compare
# against, from the llama.cpp tree vendored in llama-cpp-python's source distribution on PyPI
# (the version requirements.txt pins), for this CPU (GGML_NATIVE), without CURL, and without its AMX
# backend, which segfaults in ggml_backend_amx_mul_mat on Intel CPUs with AMX (llama.cpp issue
# 20824; scripts/install-deps.sh builds llama-cpp-python's the same way).
# Usage: benchmarks/build_llama_cpp.sh [DIR]   (default build/peers/llama.cpp; about 5 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/peers/llama.cpp}
version=$(sed -n 's/^llama-cpp-python==//p' requirements.txt)
[ -n "$version" ] || { echo "requirements.txt pins no llama-cpp-python" >&2; exit 1; }
if [ -x "$dir/build/bin/llama-server" ] && [ -x "$dir/build/bin/llama-bench" ]; then
  echo "$dir/build/bin: llama-server and llama-bench are built"
  exit 0
fi
mkdir -p "$dir"
start=$(date +%s)
.venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
  --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$dir/sdist"
tar -xzf "$dir/sdist/llama_cpp_python-$version.tar.gz" -C "$dir/sdist"
src="$dir/sdist/llama_cpp_python-$version/vendor/llama.cpp"
# The compiler's output goes to build.log (GCC 12 warns at length about AVX-512 intrinsics).
log="$dir/build.log"
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if ! { cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
         -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" \
         -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
         -DLLAMA_BUILD_EXAMPLES=OFF &&
       cmake --build "$dir/build" -j "$(nproc)" --target llama-server llama-bench; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "building llama.cpp failed: $log" >&2
  exit 1
fi
echo "$dir/build/bin: llama-server and llama-bench (llama.cpp from llama-cpp-python $version)" \
  "built in $(( $(date +%s) - start )) s"
