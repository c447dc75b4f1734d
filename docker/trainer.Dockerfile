# lmforge/trainer: the trainer (torchrun, FSDP2; the chart runs `python -m torch.distributed.run -m lmforge.trainer`);
# also the image of the train pipeline's Kubeflow steps (train, export, evaluate, rollout).
# Installs only lmforge-common[model], lmforge-trainer[tracking], lmforge-uploader (export restores
# checkpoints with `lmforge-uploader restore`), lmforge-pipelines[train] (kfp, kubernetes, the Helm
# SDK), at the versions of docker/locks/trainer.lock, and the chart in /opt/lmforge/chart (the
# training step renders its training template: LMFORGE_CHART_DIR).
#
# Build context: build/images/trainer, made by `make image-trainer` (docker/wheelhouse.py):
# the wheels, the lock and chart/ (helm/lmforge), nothing else of the repository (no
# credentials, no models).
#   make image-trainer [BASE_IMAGE=...]
# BASE_IMAGE: a CUDA PyTorch image with Python 3.11 and torch 2.13.0 (the default), whose torch
# the image uses (TORCH_SOURCE=auto finds it; see docker/venv.sh), or any Python 3.11 image
# without torch, on which torch comes from the wheelhouse (`make test-images` uses a local
# Debian base and the CPU wheel). The CUDA tag below is an example: pick the one matching
# your driver.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime

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

# Final stage: the base, a non-root user, the venv. No build files, no pip cache.
FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="lmforge-trainer" \
      org.opencontainers.image.description="lmforge: the trainer (torchrun, FSDP2; the chart runs `python -m torch.distributed.run -m lmforge.trainer`)" \
      org.opencontainers.image.version="${VERSION}"
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/lmforge --shell /usr/sbin/nologin lmforge \
    && mkdir -p /app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LMFORGE_CHART_DIR=/opt/lmforge/chart
COPY --from=deps /opt/venv /opt/venv
COPY --from=app /opt/app/ /opt/venv/
COPY chart/ /opt/lmforge/chart/
WORKDIR /app
USER 10001:10001
ENTRYPOINT ["lmforge-train"]
