#!/bin/sh
# The install steps of docker/service.Dockerfile; runs inside the build, as root, from the
# build context that docker/wheelhouse.py made (see docker/README.md). No network: every
# install is `--no-index` from the wheels in the context.
#
#   venv.sh deps   create /opt/venv and install exactly /build/deps/requirements.lock into it
#   venv.sh app    install the service's own wheels (/build/own) into /opt/app, a tree that
#                  the final stage copies over /opt/venv (its bin/ and site-packages/)
#
# deps reads PYTHON_VERSION (the Python the wheelhouse was made for) and TORCH_SOURCE:
#   wheelhouse  install torch from the wheelhouse (the CPU wheel, or the CUDA wheel if the
#               wheelhouse was made against plain PyPI) on a base without torch;
#   base        use the torch of the base image (a CUDA PyTorch base): the venv sees the
#               base's site-packages, and the lock's lines marked `# with torch` (torch and
#               what only torch needs: nvidia-*, triton, sympy, ...) are skipped;
#   auto        (default) base if the base's python3 imports torch, else wheelhouse.
# Images whose lock has no torch ignore TORCH_SOURCE and never see the base's packages.
set -eu

VENV=/opt/venv
PIP_FLAGS="--no-cache-dir --no-index --disable-pip-version-check --no-input"
fail() { echo "lmforge image build: $*" >&2; exit 1; }

deps() {
  command -v python3 >/dev/null || fail "BASE_IMAGE has no python3 on PATH"
  have=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$have" = "${PYTHON_VERSION:?}" ] || fail "BASE_IMAGE has Python $have, the wheelhouse is for \
Python $PYTHON_VERSION (its binary wheels are cp${PYTHON_VERSION%.*}${PYTHON_VERSION#*.}): use a base with Python $PYTHON_VERSION"
  lock=/build/deps/requirements.lock
  if grep -q '^torch==' "$lock"; then
    source=${TORCH_SOURCE:-auto}
    if [ "$source" = auto ]; then
      if python3 -c 'import torch' 2>/dev/null; then source=base; else source=wheelhouse; fi
    fi
    case $source in
      base)
        torch=$(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)') \
          || fail "TORCH_SOURCE=base but the base image's python3 cannot import torch"
        echo "torch from the base image: $torch"
        python3 -m venv --system-site-packages "$VENV"
        # The venv's own setuptools (Python 3.11's ensurepip) would hide the base's, which
        # its torch needs.
        "$VENV/bin/python" -m pip uninstall --quiet --yes setuptools
        grep -v -E '# with torch$' "$lock" > /tmp/requirements.lock ;;
      wheelhouse)
        echo "torch from the wheelhouse: $(grep -o '^torch==[^ ]*' "$lock")"
        python3 -m venv "$VENV"
        cp "$lock" /tmp/requirements.lock ;;
      *) fail "TORCH_SOURCE must be auto, base or wheelhouse (got '$source')" ;;
    esac
  else
    python3 -m venv "$VENV"
    cp "$lock" /tmp/requirements.lock
  fi
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install $PIP_FLAGS --find-links /build/deps -r /tmp/requirements.lock
  rm -f /tmp/requirements.lock
}

app() {
  # First resolve against the installed lock: fails if the lock lacks a dependency of the
  # service or pins a version its pyproject.toml excludes (then: `make image-locks`).
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install $PIP_FLAGS --dry-run --quiet --find-links /build/own -r /build/own/requirements.txt \
    || fail "docker/locks does not satisfy the services' pyproject.toml: run \`make image-locks\`"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install $PIP_FLAGS --no-deps --prefix /opt/app /build/own/*.whl
  site=$(cd /opt/app && echo lib/python3*/site-packages)
  PYTHONPATH=/opt/app/$site "$VENV/bin/python" -m pip check --disable-pip-version-check \
    || [ "$(sed -n 's/^include-system-site-packages = //p' "$VENV/pyvenv.cfg")" = true ] \
    || fail "pip check failed"
}

case ${1:-} in
  deps) deps ;;
  app) app ;;
  *) fail "usage: venv.sh deps|app" ;;
esac
