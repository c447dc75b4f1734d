#!/usr/bin/env bash
# Build a minimal local base image (Debian bookworm + python3, python3-venv, ca-certificates)
# with debootstrap and import it, for machines without a registry (tests, air-gapped CI).
# Production builds use public bases instead (see docker/README.md).
#
#   docker/make-base-image.sh [IMAGE]        IMAGE defaults to localhost/lmforge-base:bookworm
#
# Environment: CONTAINER_ENGINE (podman|docker, default: whichever exists),
#   DEBIAN_MIRROR (default http://deb.debian.org/debian), FORCE=1 to rebuild.
# Idempotent: does nothing when IMAGE already exists. Needs root (debootstrap).
set -euo pipefail

IMAGE=${1:-localhost/lmforge-base:bookworm}
ENGINE=${CONTAINER_ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm

if [ "${FORCE:-0}" != 1 ] && "$ENGINE" image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base image $IMAGE exists"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }

root=$(mktemp -d "${TMPDIR:-/tmp}/lmforge-base.XXXXXX")
trap 'rm -rf --one-file-system "$root"' EXIT
start=$(date +%s)
echo "debootstrap $SUITE into $root (mirror $MIRROR)"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# Trim what a runtime image does not need: apt lists and caches, docs, man pages, locales.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log
find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
# A name server from the build host would be stale inside the image.
: > "$root"/etc/resolv.conf
quiet=(); [ "$(basename "$ENGINE")" = podman ] && quiet=(--quiet)
tar --numeric-owner -C "$root" -c . | "$ENGINE" import "${quiet[@]}" \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  - "$IMAGE" >/dev/null
echo "imported $IMAGE in $(( $(date +%s) - start ))s"
