"""What `lmforge-demo run` does, and how big: every knob with the default `make demo` uses.

Set a field with `--set section.field=value`, `--config FILE` (YAML) or the environment
(`LMFORGE_DEMO__TRAIN__STEPS=200`); `DEMO_CRAWL=CC-MAIN-…` is read as `data.crawl`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from lmforge.common.config import StrictModel, load_config

ENV_PREFIX = "LMFORGE_DEMO"


class DataSection(StrictModel):
    crawl: str = Field("sample", description='"sample" (generated WET files) or a crawl id, e.g. CC-MAIN-2024-22 '
                                              "(needs network)")
    wet_files: int = Field(2, ge=1, description="WET files: generated, or the crawl's first N")
    docs_per_file: int = Field(4000, ge=1, description="documents per generated WET file (about 4 MB of text per 1000)")
    workers: int = Field(2, ge=1, description="data-prep workers (the pipeline's ParallelFor)")
    languages: str = Field("en", description="kept languages, comma-separated fastText codes")
    vocab_size: int = Field(4096, ge=256, description="BPE vocabulary trained on the kept text")
    shard_tokens: int = Field(1_000_000, ge=1000, description="tokens per shard file")
    val_fraction: float = Field(0.02, gt=0, lt=1, description="share of documents in the validation split")
    trace_index: bool = Field(True, description="build the exact-match trace index over the training tokens "
                              "(data prep's trace-index stage); the server then answers /v1/trace from it")


class TrainSection(StrictModel):
    preset: str = Field("tiny", description="model preset (lmforge.model.transformer presets)")
    nproc: int = Field(2, ge=1, description="torchrun processes; FSDP when more than one")
    steps: int = Field(300, ge=2)
    seq_len: int = Field(128, ge=8)
    batch_size: int = Field(8, ge=1, description="sequences per process per step")
    checkpoint_every: int = Field(50, ge=1)
    interrupt_at: int = Field(180, ge=1, description="the first attempt is killed (SIGKILL) at this step; it must "
                                                   "come after a checkpoint and before the last step")
    eval_every: int = Field(100, ge=1)
    recipe: Literal["plain", "curriculum"] = Field(
        "plain", description="plain: one stage; curriculum: seq_len for the first half of the tokens, then twice "
        "that with document masking and a 4x RoPE base, then an anneal stage over WSD's decay (the last 20%)")
    bucket: str = Field("lmforge-demo", description="the local S3 bucket checkpoints are uploaded to")
    weights_every: int = Field(50, ge=0, description="a weights-only checkpoint every N steps (and at the last), "
                               "each evaluated by a job the uploader sidecar launches (0: none)")
    eval_max_concurrent: int = Field(1, ge=1, description="evaluation jobs at once (two CPU cores: one)")
    break_last_weights: bool = Field(True, description="zero the last weights checkpoint (the trainer's fault "
                                     "injection): its held-out loss regresses, the alert fires, it is not promoted")

    @model_validator(mode="after")
    def _interrupt_between_checkpoint_and_end(self) -> TrainSection:
        if not self.checkpoint_every < self.interrupt_at < self.steps:
            raise ValueError(f"interrupt_at ({self.interrupt_at}) must be after the first checkpoint "
                             f"(checkpoint_every={self.checkpoint_every}) and before steps ({self.steps})")
        return self


class ServeSection(StrictModel):
    api_key: str = Field("lmforge-demo-key", description="the demo API key (written to WORKDIR/serve/api-keys)")
    port: int = Field(8000, ge=0, le=65535, description="the inference server's port (0: any free port)")
    prompts: list[str] = Field(default_factory=lambda: ["The history of the city", "Our team offers",
                                                        "How to choose a"], min_length=1)
    max_tokens: int = Field(32, ge=1)
    canary_texts: int = Field(8, ge=1, description="validation documents in the canary's eval set")


class ObserveSection(StrictModel):
    prometheus_port: int = Field(9090, ge=0, le=65535, description="0: any free port")
    pushgateway_port: int = Field(9091, ge=0, le=65535, description="0: any free port")
    scrape_interval: str = Field("2s", description="Prometheus scrape and rule-evaluation interval")
    rate_window: str = Field("30s", description="the chart's monitoring.rateWindow, short enough for a demo")


class DemoConfig(StrictModel):
    workdir: str = Field("demo-output", description="everything the demo writes; each stage's directory appears "
                                                    "only when the stage is complete")
    hold: bool = Field(True, description="keep the servers up after the summary until Ctrl-C")
    data: DataSection = Field(default_factory=DataSection)
    train: TrainSection = Field(default_factory=TrainSection)
    serve: ServeSection = Field(default_factory=ServeSection)
    observe: ObserveSection = Field(default_factory=ObserveSection)


def load_demo_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> DemoConfig:
    crawl = os.environ.get("DEMO_CRAWL")
    early = [f"data.crawl={crawl}"] if crawl else []
    return load_config(DemoConfig, path, [*early, *overrides], env_prefix=ENV_PREFIX)
