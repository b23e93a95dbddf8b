#!/usr/bin/env bash
# Builds the Sluice image from this machine's build (what `make image` runs): stages the built
# binary and its libtorch libraries into BUILD_DIR/image/ (scripts/image-stage.sh), makes the
# Debian 12 base locally when no registry can be reached (scripts/base-image.sh), and builds
# deploy/Containerfile with SLUICE_BUILD=prebuilt. Prints the image's size and layers.
#
# Usage: scripts/image.sh [BUILD_DIR] [IMAGE]   (defaults: build, localhost/sluice:0.1.0)
# BASE_IMAGE=... uses that base instead of making one.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
image=${2:-localhost/sluice:0.1.0}
base=${BASE_IMAGE:-$(scripts/base-image.sh)}

context="$build/image"
scripts/image-stage.sh "$build" "$context" >/dev/null
start=$(date +%s)
# chroot isolation: builds here without a daemon and without the namespaces a nested container
# cannot create.
podman build --quiet --isolation chroot --file deploy/Containerfile \
  --build-arg SLUICE_BUILD=prebuilt --build-arg "BASE_IMAGE=$base" \
  --tag "$image" "$context" >/dev/null
echo "image: $image built in $(( $(date +%s) - start )) s from $base"
podman image inspect "$image" --format 'image: {{.Size}} bytes, {{len .RootFS.Layers}} layers'
