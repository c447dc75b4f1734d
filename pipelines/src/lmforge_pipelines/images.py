"""The lmforge images the pipeline steps run in (on KFP; kfp.local runs them in this environment).

Each step runs in the image of the service it calls: data-prep steps in lmforge/dataprep, the
training, export, evaluation and rollout steps in lmforge/trainer. Those images must also carry
this package (`pip install ./pipelines`: the step code and kfp itself, which the components do
not install at run time) and, for the trainer image, lmforge-uploader (the export step restores
a checkpoint from the object store with `lmforge-uploader restore`).

The registry and tag are read when the pipelines are compiled: LMFORGE_IMAGE_REGISTRY
(e.g. ghcr.io/my-org, default none) and LMFORGE_IMAGE_TAG (default the chart's appVersion).
"""

from __future__ import annotations

import os

APP_VERSION = "0.1.0"
IMAGE_REGISTRY = os.environ.get("LMFORGE_IMAGE_REGISTRY", "")
IMAGE_TAG = os.environ.get("LMFORGE_IMAGE_TAG", APP_VERSION)


def image(service: str, registry: str | None = None, tag: str | None = None) -> str:
    """[registry/]lmforge/<service>:<tag>, as the chart's lmforge.image names it."""
    registry = IMAGE_REGISTRY if registry is None else registry
    repository = f"lmforge/{service}"
    if registry:
        repository = f"{registry.rstrip('/')}/{repository}"
    return f"{repository}:{tag or IMAGE_TAG}"


DATAPREP_IMAGE = image("dataprep")
TRAINER_IMAGE = image("trainer")
UPLOADER_IMAGE = image("uploader")
