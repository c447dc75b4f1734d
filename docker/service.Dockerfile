# Every lmforge service image (docker/README.md): one Dockerfile, built once per service by
# docker/build.sh, which sets its build arguments and picks the service's stage:
#
#   docker/build.sh SERVICE TAG        (make image-SERVICE; the image tests call it too)
#   = ENGINE build --target SERVICE --build-arg SERVICE=SERVICE --build-arg BASE_IMAGE=...
#       --file docker/service.Dockerfile build/images/SERVICE
#
# Build context: build/images/SERVICE, made by docker/wheelhouse.py: the wheels of
# docker/locks/SERVICE.lock and of the service's own distributions, venv.sh, and (trainer)
# chart/; nothing else of the repository (no credentials, no models).
#
# Build arguments:
#   SERVICE       dataprep | trainer | uploader | inference | canary; the image's title
#                 (lmforge-SERVICE); --target names the same service's stage below
#   BASE_IMAGE    any image with Python 3.11 and python3 -m venv; docker/build.sh's default is
#                 python:3.11-slim-bookworm, or for an image whose lock has torch (trainer,
#                 inference) a CUDA PyTorch image with torch 2.13.0, whose torch the image uses
#   TORCH_SOURCE  auto | base | wheelhouse: where torch comes from (docker/venv.sh); images
#                 whose lock has no torch ignore it
#   VERSION       the image's version label
ARG BASE_IMAGE

# Stage 1: the third-party distributions of the lock, in /opt/venv.
FROM ${BASE_IMAGE} AS deps
ARG PYTHON_VERSION=3.11
ARG TORCH_SOURCE=auto
COPY venv.sh /build/venv.sh
COPY deps/ /build/deps/
RUN sh /build/venv.sh deps

# Stage 2: the lmforge distributions, in /opt/app (copied over /opt/venv below), so that a
# source change rebuilds one small layer, not the venv.
FROM deps AS app
COPY own/ /build/own/
RUN sh /build/venv.sh app

# Stage 3, what every image is: the base, a non-root user, the venv. No build files, no pip cache.
FROM ${BASE_IMAGE} AS runtime
ARG SERVICE
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="lmforge-${SERVICE}" \
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

# The final stage, one per service (--target SERVICE): what differs between the images, which
# is their description and entrypoint (an exec-form ENTRYPOINT takes no build argument), the
# inference port and the trainer's chart.

# Data preparation; also the image of the data pipeline's Kubeflow steps.
FROM runtime AS dataprep
LABEL org.opencontainers.image.description="lmforge: data preparation: Common Crawl WET to clean, deduplicated, tokenized shards"
ENTRYPOINT ["lmforge-dataprep"]

FROM runtime AS uploader
LABEL org.opencontainers.image.description="lmforge: the checkpoint-uploader sidecar and restore init container"
ENTRYPOINT ["lmforge-uploader"]

FROM runtime AS inference
LABEL org.opencontainers.image.description="lmforge: the OpenAI-compatible inference server"
EXPOSE 8000
ENTRYPOINT ["lmforge-serve"]

FROM runtime AS canary
LABEL org.opencontainers.image.description="lmforge: the daily canary eval"
ENTRYPOINT ["lmforge-canary"]

# The trainer; also the image of the train pipeline's Kubeflow steps (train, export, evaluate,
# rollout), with the chart in /opt/lmforge/chart (the training step renders its training
# template). Last: only the trainer's build context has chart/, and an engine that builds every
# stage before the target (docker's legacy builder) then never reaches this one for another image.
FROM runtime AS trainer
LABEL org.opencontainers.image.description="lmforge: the trainer (torchrun, FSDP2; the chart runs `python -m torch.distributed.run -m lmforge.trainer`)"
ENV LMFORGE_CHART_DIR=/opt/lmforge/chart
COPY chart/ /opt/lmforge/chart/
ENTRYPOINT ["lmforge-train"]
