# lmforge/canary: the daily canary eval.
# Installs only lmforge-common, lmforge-canary (no torch),
# at the versions of docker/locks/canary.lock.
#
# Build context: build/images/canary, made by `make image-canary` (docker/wheelhouse.py):
# the wheels and the lock, nothing else of the repository (no credentials, no models).
#   make image-canary [BASE_IMAGE=...]
# BASE_IMAGE: any image with Python 3.11 and python3 -m venv (the default: the official slim
# image; `make test-images` uses a local Debian base).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# Stage 1: the third-party distributions of the lock, in /opt/venv.
FROM ${BASE_IMAGE} AS deps
ARG PYTHON_VERSION=3.11
COPY venv.sh /build/venv.sh
COPY deps/ /build/deps/
RUN sh /build/venv.sh deps

# Stage 2: the lmforge distributions, in /opt/app (copied over /opt/venv below), so that a
# source change rebuilds one small layer, not the venv.
FROM deps AS app
COPY own/ /build/own/
RUN sh /build/venv.sh app

# Final stage: the base, a non-root user, the venv. No build files, no pip cache.
FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="lmforge-canary" \
      org.opencontainers.image.description="lmforge: the daily canary eval" \
      org.opencontainers.image.version="${VERSION}"
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/lmforge --shell /usr/sbin/nologin lmforge \
    && mkdir -p /app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=deps /opt/venv /opt/venv
COPY --from=app /opt/app/ /opt/venv/
WORKDIR /app
USER 10001:10001
ENTRYPOINT ["lmforge-canary"]
