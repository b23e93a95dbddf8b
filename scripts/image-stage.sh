#!/usr/bin/env bash
# Stages what the Sluice image runs: the `sluice` binary (stripped) and the libraries it loads
# from outside Debian's packages (libtorch_cpu, libc10 and PyTorch's libgomp from the venv's
# wheel, and the two CUDA runtime libraries libtorch_cpu links: cudart, cupti), laid out as
# OUT/opt/sluice/{bin,lib}. The image's Debian runtime packages provide the rest; a library that
# resolves to neither is an error here, not a container that cannot start.
#
# Usage: scripts/image-stage.sh BUILD_DIR OUT
set -euo pipefail
build=${1:?usage: image-stage.sh BUILD_DIR OUT}
out=${2:?usage: image-stage.sh BUILD_DIR OUT}
binary="$build/sluice"
[ -x "$binary" ] || { echo "image-stage: $binary is not built" >&2; exit 1; }

rm -rf "$out/opt/sluice"
mkdir -p "$out/opt/sluice/bin" "$out/opt/sluice/lib"
strip --strip-unneeded -o "$out/opt/sluice/bin/sluice" "$binary"

missing=$(ldd "$binary" | awk '/not found/ {print $1}')
[ -z "$missing" ] || { echo "image-stage: unresolved libraries: $missing" >&2; exit 1; }
# Everything ldd resolves outside the system's library directories travels with the binary.
ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
  case "$lib" in
    /lib/*|/usr/lib/*|/lib64/*) ;;
    *) cp -L "$lib" "$out/opt/sluice/lib/" ;;
  esac
done
ls "$out/opt/sluice/lib"
