# lmforge/dataprep: data preparation: Common Crawl WET to clean, deduplicated, tokenized shards;
# also the image of the data pipeline's Kubeflow steps (`python3 -m kfp.dsl.executor_main` running
# lmforge_pipelines' components). Installs only lmforge-common, lmforge-dataprep,
# lmforge-pipelines[data] (kfp; no FastAPI, no torch, no Helm SDK),
# at the versions of docker/locks/dataprep.lock.
#
# Build context: build/images/dataprep, made by `make image-dataprep` (docker/wheelhouse.py):
# the wheels and the lock, nothing else of the repository (no credentials, no models).
#   make image-dataprep [BASE_IMAGE=...]
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
LABEL org.opencontainers.image.title="lmforge-dataprep" \
      org.opencontainers.image.description="lmforge: data preparation: Common Crawl WET to clean, deduplicated, tokenized shards" \
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
ENTRYPOINT ["lmforge-dataprep"]
