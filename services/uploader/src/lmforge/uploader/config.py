"""Uploader configuration (pydantic; YAML, then LMFORGE_UPLOADER__… env, then key=value)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

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


class EvaluationSection(StrictModel):
    """The evaluation branch (eval_launcher.py): a job per uploaded weights package, its result
    scored and recorded, the best promoted."""

    enabled: bool = Field(False, description="launch an evaluation job for each uploaded weights package "
                          "(needs `watch --weights-dir`)")
    max_concurrent: int = Field(2, ge=1, le=64, description="evaluation jobs running at once; an older package "
                                "overtaken by a newer launch is skipped (never the final one)")
    runner: Literal["subprocess", "kubernetes"] = Field("subprocess", description="how a job runs: a local "
                                                         "process (`command`) or a Kubernetes Job (`job_template`)")
    command: list[str] = Field(default_factory=list, description="subprocess runner: the job's argv prefix; "
                               "--package, --step and --out are appended")
    job_template: str = Field("", description="kubernetes runner: path of the Job manifest (JSON); its first "
                              "container's args get --package, --step and --out")
    namespace: str = Field("", description="kubernetes runner: the Jobs' namespace ('' = the pod's: the service "
                           "account's namespace file, else LMFORGE_NAMESPACE)")
    score: str = Field("heldout/loss", min_length=1, description="what ranks checkpoints: \"TASK/METRIC\" of "
                       "the result's tasks, or \"heldout/loss\" (mean held-out loss over sources), or a weighted "
                       "sum of those, e.g. \"0.5*arc_easy/acc + 0.5*hellaswag/acc_norm\" (a checkpoint missing a "
                       "term has no score)")
    mode: Literal["max", "min"] = Field("min", description="whether a higher or a lower score is better")
    score_drop: float = Field(0.1, ge=0, description="a task metric this far below its best so far is regressed")
    loss_rise: float = Field(0.5, ge=0, description="a held-out loss this far above its best so far is regressed")
    promote: Literal["pointer", "propose", "off"] = Field(
        "off", description="on a new best: copy it to `models_store` and point `pointer` at it; write "
        "evals/proposal.json for the pipeline's rollout; or nothing")
    pointer: str = Field("", description="promote=pointer: the model pointer URI")
    models_store: str = Field("", description="promote=pointer: URI prefix a promoted package is copied under, "
                              "as <models_store>/<run>-step-N")
    run: str = Field("", max_length=200, description="the run's name (Job names, packages); '' = the run "
                     "directory's name")

    @model_validator(mode="after")
    def _complete(self) -> EvaluationSection:
        if self.enabled and self.runner == "subprocess" and not self.command:
            raise ValueError("evaluation.runner=subprocess needs evaluation.command")
        if self.enabled and self.runner == "kubernetes" and not self.job_template:
            raise ValueError("evaluation.runner=kubernetes needs evaluation.job_template")
        if self.promote == "pointer" and not (self.pointer and self.models_store):
            raise ValueError("evaluation.promote=pointer needs evaluation.pointer and evaluation.models_store")
        score_terms(self.score)
        return self


def score_terms(score: str) -> list[tuple[float, str]]:
    """`evaluation.score` as (weight, name) terms: "a/acc" is [(1.0, "a/acc")]; "0.5*a/acc + 0.5*b/acc"
    two terms; a name is TASK/METRIC or heldout/loss."""
    terms = []
    for part in score.split("+"):
        weight, _, name = part.strip().rpartition("*")
        name = name.strip()
        try:
            value = float(weight) if weight.strip() else 1.0
        except ValueError:
            value = None
        if value is None or "/" not in name.strip("/"):
            raise ValueError(f"evaluation.score {score!r}: expected TASK/METRIC, heldout/loss, or a weighted sum "
                             "of them such as 0.5*a/acc + 0.5*b/acc_norm")
        terms.append((value, name))
    return terms


class UploaderConfig(StrictModel):
    transfer: TransferSection = Field(default_factory=TransferSection)
    poll_seconds: float = Field(2.0, gt=0, description="how often the checkpoint directory is scanned")
    keep: int = Field(3, ge=1, description="checkpoints kept in the object store, plus the best")
    weights_keep: int = Field(3, ge=1, description="weights packages kept in the object store, plus the promoted "
                              "one and those an evaluation still needs")
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
    evaluation: EvaluationSection = Field(default_factory=EvaluationSection,
                                          description="evaluate each uploaded weights package (watch --weights-dir)")


def load_uploader_config(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> UploaderConfig:
    return load_config(UploaderConfig, path, overrides, env_prefix=ENV_PREFIX)
