#!/usr/bin/env bash
# Makes a Debian 12 (bookworm) base image from Debian's archive and imports it into the local
# container storage, for building deploy/Containerfile where no container registry can be reached
# (the Containerfile's default base is the registry's debian:bookworm-slim; this is the same
# distribution, made locally). mmdebstrap's minbase variant: the Essential packages and apt.
#
# Usage: scripts/base-image.sh [IMAGE]   (default localhost/sluice-debian:bookworm)
# Prints the image's name. Does nothing when the image already exists; FORCE=1 remakes it.
set -euo pipefail
image=${1:-localhost/sluice-debian:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if [ "${FORCE:-0}" != 1 ] && podman image exists "$image"; then
  echo "$image"
  exit 0
fi
tarball=$(mktemp --suffix=.tar)
trap 'rm -f "$tarball"' EXIT
echo "base-image: mmdebstrap bookworm (minbase) from $mirror" >&2
# The security and updates suites too, so the base carries Debian 12's current fixes.
mmdebstrap --variant=minbase --quiet \
  --aptopt='Acquire::Retries "3"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  bookworm "$tarball" \
  "deb $mirror bookworm main" \
  "deb $mirror bookworm-updates main" \
  "deb ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main"
podman import --quiet \
  --change 'CMD ["/bin/bash"]' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  "$tarball" "$image" >/dev/null
echo "$image"
