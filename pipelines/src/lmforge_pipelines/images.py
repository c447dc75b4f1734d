"""The lmforge images the pipeline steps run in (on KFP; kfp.local runs them in this environment).

Each step runs in the image of the service it calls: data-prep steps in lmforge/dataprep, the
training, export, evaluation and rollout steps in lmforge/trainer. Those images carry this
package and kfp itself, which the components do not install at run time (docker/wheelhouse.py:
lmforge-pipelines[data] and [train]); the trainer image also lmforge-uploader (the export step
restores a checkpoint from the object store with `lmforge-uploader restore`), the Helm SDK and the
chart (LMFORGE_CHART_DIR) for the training job. tests/images/test_pipeline_steps.py runs every
component in its image.

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
