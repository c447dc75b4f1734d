"""Uploader configuration (pydantic; YAML, then LMFORGE_UPLOADER__… env, then key=value)."""

from __future__ import annotations

from pydantic import Field

from lmforge.common.config import StrictModel, load_config
from lmforge.common.retry import RetrySettings

ENV_PREFIX = "LMFORGE_UPLOADER"
MIB = 1 << 20


class TransferSection(RetrySettings):
    """How checkpoint files move to and from the object store; `attempts`, `backoff_seconds` and
    `backoff_max_seconds` (RetrySettings, defaults 8, 0.2 s, 20 s) retry each request."""

    renamed = {"max_attempts": "attempts"}

    part_size_mb: int = Field(8, ge=5, le=5120, description="multipart part size; grows so a file needs at most "
                              "10,000 parts (S3: 5 MiB to 5 GiB)")
    concurrency: int = Field(10, ge=1, le=64, description="parts in flight at once")
    connect_timeout_seconds: float = Field(10.0, gt=0)
    read_timeout_seconds: float = Field(60.0, gt=0)

    @property
    def part_size(self) -> int:
        return self.part_size_mb * MIB


class UploaderConfig(StrictModel):
    transfer: TransferSection = Field(default_factory=TransferSection)
    poll_seconds: float = Field(2.0, gt=0, description="how often the checkpoint directory is scanned")
    keep: int = Field(3, ge=1, description="checkpoints kept in the object store, plus the best")
    free_disk_above: float | None = Field(
        None, gt=0, lt=1, description="delete uploaded local checkpoints (never the newest) above this volume usage")
    grace_seconds: float = Field(30.0, ge=0, description="on SIGTERM: time to finish the upload in flight")
    retry_failed_after_seconds: float = Field(30.0, ge=0, description="wait before retrying a failed checkpoint; "
                                              "doubles with each further failure of it")
    retry_failed_max_seconds: float = Field(600.0, gt=0, description="the longest wait before retrying a failed "
                                            "checkpoint")
    identity: str = Field("", max_length=200, description="this uploader's name on its lease in the store: unique "
                          "among the run's live uploaders (the chart: the pod's name); '' = host name and process "
                          "id. Open uploads under a lease of this name were left by a dead predecessor")
    stale_upload_seconds: float = Field(
        300.0, ge=5, description="an open multipart upload, or a checkpoint without its manifest, that no live "
        "uploader's lease claims and that is older than this is stale: aborted or removed. A lease is live while "
        "refreshed (every quarter of this)")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics (0: off)")


def load_uploader_config(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> UploaderConfig:
    return load_config(UploaderConfig, path, overrides, env_prefix=ENV_PREFIX)
