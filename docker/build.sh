#!/usr/bin/env bash
# Build one service image: make its build context (docker/wheelhouse.py), then build the
# service's stage of docker/service.Dockerfile on it (--target SERVICE, --build-arg SERVICE).
# `make image-SERVICE` and the image tests call this.
#
#   docker/build.sh SERVICE TAG
#
# Environment:
#   CONTAINER_ENGINE        podman | docker (default: whichever exists, podman first)
#   BASE_IMAGE              the base ("" = the default: $TORCH_BASE_IMAGE for an image whose
#                           lock has torch, trainer and inference; else $SLIM_BASE_IMAGE)
#   TORCH_SOURCE            auto | base | wheelhouse (images whose lock has torch; default auto)
#   CONTAINER_BUILD_FLAGS   extra flags for `build` (e.g. podman's --runtime/--ulimit here)
#   VERSION                 the image's version label
#   PYTHON                  the Python that runs pip for the wheelhouse (default .venv/bin/python)
#   FORCE_BUILD=1           build even if TAG was built from identical inputs
#
# TAG carries a label with a digest of everything that went into it (Dockerfile, build
# arguments, base image id, every file of the build context); when TAG exists with the same
# digest the engine is not called at all (its layer cache would rebuild nothing anyway, but
# only after checksumming the whole context again).
set -euo pipefail

service=${1:?usage: docker/build.sh SERVICE TAG}
tag=${2:?usage: docker/build.sh SERVICE TAG}
repo=$(cd "$(dirname "$0")/.." && pwd)
engine=${CONTAINER_ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
python=${PYTHON:-$repo/.venv/bin/python}
context=$repo/build/images/$service

dockerfile=$repo/docker/service.Dockerfile
grep -q "^FROM runtime AS $service\$" "$dockerfile" || { echo "no stage '$service' in docker/service.Dockerfile" >&2; exit 2; }
# The default bases. The CUDA tag is an example: pick the one matching your driver.
SLIM_BASE_IMAGE=python:3.11-slim-bookworm
TORCH_BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime
with_torch=$(grep -q '^torch==' "$repo/docker/locks/$service.lock" 2>/dev/null && echo 1 || true)
base=${BASE_IMAGE:-$([ -n "$with_torch" ] && echo "$TORCH_BASE_IMAGE" || echo "$SLIM_BASE_IMAGE")}
start=$(date +%s)
"$python" "$repo/docker/wheelhouse.py" context "$service" "$context"

args=(--file "$dockerfile" --target "$service" --tag "$tag" --build-arg "SERVICE=$service" --build-arg "BASE_IMAGE=$base")
[ -n "$with_torch" ] && [ -n "${TORCH_SOURCE:-}" ] && args+=(--build-arg "TORCH_SOURCE=$TORCH_SOURCE")
[ -n "${VERSION:-}" ] && args+=(--build-arg "VERSION=$VERSION")

label() { "$engine" image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }
digest=$( {
  cat "$dockerfile"
  printf '%s\n' "${args[@]}" "${CONTAINER_BUILD_FLAGS:-}" "$("$engine" image inspect --format '{{.Id}}' "$base" 2>/dev/null)"
  (cd "$context" && find . -type f | LC_ALL=C sort | xargs sha256sum)
} | sha256sum | cut -c1-64)
if [ "${FORCE_BUILD:-0}" != 1 ] && [ "$(label "$tag" lmforge.build-digest)" = "$digest" ]; then
  echo "$tag is up to date (built from identical inputs)"
  exit 0
fi
old_id=$("$engine" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
# shellcheck disable=SC2086
"$engine" build ${CONTAINER_BUILD_FLAGS:-} "${args[@]}" --label "lmforge.build-digest=$digest" "$context"
# The image this build replaced under TAG, now untagged: remove it (not the build cache).
if [ -n "$old_id" ] && [ "$old_id" != "$("$engine" image inspect --format '{{.Id}}' "$tag")" ]; then
  "$engine" image rm "$old_id" >/dev/null 2>&1 || true
fi
echo "built $tag in $(( $(date +%s) - start ))s"
