"""Data-prep configuration. Every threshold is a named default with its source.

Gopher = Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights from
Training Gopher", Appendix A (quality filters, Table A1 repetition thresholds).

The per-document filters are an ordered `pipeline` of step ids, each step's settings under
`steps.<id>` (step_registry.py says how a step type is found).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from lmforge.common.config import StrictModel, load_config
from lmforge.common.retry import reject_renamed
from lmforge.dataprep.step_registry import BUILTIN_STEPS, DEFAULT_PIPELINE, StepSettings, settings_for, step_class

ENV_PREFIX = "LMFORGE_DATAPREP"


class ReaderConfig(StrictModel):
    min_text_chars: int = Field(1, ge=0, description="records with fewer characters are dropped as empty")
    open_attempts: int = Field(3, ge=1, description="tries to open a remote input before it counts as unreadable")
    format: Literal["auto", "wet", "warc"] = Field(
        "auto", description="which records are documents: wet = `conversion` records (text), warc = `response` "
                            "records (HTML, main text extracted), auto = whichever each input holds")
    extractor: Literal["resiliparse", "trafilatura"] = Field(
        "resiliparse", description="main-text extractor for WARC HTML. resiliparse (with prune_boilerplate) measured "
                                   "best on our hand-made documentation pages (token F1 and pages/s: "
                                   "bench/html_extraction.py, docs/design.md)")
    prune_boilerplate: bool = Field(
        True, description="resiliparse: drop nav/footer/aside/ARIA landmarks, cookie banners, breadcrumbs, "
                          "TOCs first and extract only <main>/role=main/the one <article> when the page has one "
                          "(its code blocks and tables are kept whole, never judged by the main-content heuristic)")
    main_content: bool = Field(
        True, description="resiliparse: its main-content heuristic (extract_plain_text main_content=True), used "
                          "where the page marks no main element")
    trafilatura_mode: Literal["balanced", "precision", "recall"] = Field(
        "balanced", description="trafilatura: its defaults, favor_precision or favor_recall")
    max_html_bytes: int = Field(
        4 << 20, ge=1024, description="HTML pages larger than this (after content decoding) are dropped unparsed: "
                                      "a bound on extractor time and memory (Common Crawl cuts payloads at 1 MiB)")
    # Common Crawl truncates a response's payload at 1 MiB: its WARC records hold that plus HTTP
    # headers, and a WET record's text, extracted from such a page, is shorter, except where UTF-8
    # takes two bytes for a character its page's one-byte charset (Cyrillic, Greek) stored in one.
    # Twice that keeps every record of a crawl and still bounds a worker's memory per record.
    max_record_bytes: int = Field(
        2 << 20, ge=1024, description="a document record (WET text, WARC HTTP response) whose block is larger than "
                                      "this is dropped as `record_too_large` without being read into memory: a "
                                      "bound on a worker's memory per record (twice Common Crawl's 1 MiB truncation)")

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        return reject_renamed(data, {"open_retries": "open_attempts"})


class MinHashConfig(StrictModel):
    enabled: bool = True
    num_perm: int = Field(128, ge=16)
    shingle_words: int = Field(5, ge=1)
    threshold: float = Field(0.8, gt=0, lt=1, description="Jaccard similarity that makes two documents duplicates")
    bands: int | None = Field(None, ge=1, description="LSH bands; default derived from threshold and num_perm")
    rows: int | None = Field(None, ge=1)
    seed: int = 1
    verify_sigmas: float = Field(
        3.0, ge=0, description="candidates are duplicates when estimated Jaccard ≥ threshold − verify_sigmas·σ, "
        "σ = sqrt(t(1−t)/num_perm): the estimator's own noise must not split a true duplicate pair")
    partitions_per_band: int | Literal["auto"] = Field(
        "auto", description="dedup tasks per key column (each LSH band, the URL and the content key), by key "
                            "range: a count ≥ 1, or auto: chosen when the run is opened, from the inputs' total "
                            "size, so a dedup task stays under task_memory_bytes (dedup_plan.py); the choice is "
                            "recorded in work/minhash_config.json")
    combine_partitions: int | Literal["auto"] = Field(
        "auto", description="dedup partitions per combine task and per combined object: a count ≥ 1, or auto: as "
                            "many as keep a combine task of the largest input group under task_memory_bytes "
                            "(dedup_plan.py), chosen and recorded like partitions_per_band")
    group_objects: int = Field(
        256, ge=1, description="input groups of the combine stage: a dedup task reads one combined object per "
                               "group (min(inputs, this) of them), whatever the number of inputs")
    task_memory_bytes: int = Field(
        1 << 30, ge=1 << 20, description="memory a combine or dedup task may use; the auto counts keep each "
                                         "task's estimated data under half of it")
    max_pairs_per_bucket: int = Field(64, ge=2, description="members a bucket member is verified against")

    @model_validator(mode="before")
    @classmethod
    def _moved_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "cluster_tasks" in data:
            raise ValueError("`minhash.cluster_tasks` is now `components.tasks` (the clusters are found in rounds)")
        return data

    @field_validator("partitions_per_band", "combine_partitions")
    @classmethod
    def _positive_count(cls, value: int | str) -> int | str:
        if value != "auto" and value < 1:
            raise ValueError(f"must be 'auto' or ≥ 1, got {value}")
        return value

    @model_validator(mode="after")
    def _bands_rows(self) -> MinHashConfig:
        if (self.bands is None) != (self.rows is None):
            raise ValueError("set both bands and rows, or neither")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands*rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        return self


class ComponentsConfig(StrictModel):
    """The duplicate clusters: connected components of the dedup edges, found in rounds (components.py)."""

    tasks: int = Field(1, ge=1, description="tasks per round, each over a share of the duplicate graph's nodes "
                                            "(memory per task grows with its share of the edges)")
    max_rounds: int = Field(32, ge=1, description="rounds run at most (a chain of n duplicates settles in about "
                                                  "2·log2(n) + 2); a round after the labels stopped changing "
                                                  "does nothing, and a graph not settled by the last fails the run")


class TokenizerConfig(StrictModel):
    path: str | None = Field(None, description="use this tokenizer.json instead of training one")
    vocab_size: int = Field(8192, ge=260, le=1 << 20)
    min_frequency: int = Field(2, ge=1)
    sample_bytes: int = Field(64 << 20, ge=1, description="bytes of cleaned text to train on")
    eot_token: str = "<|endoftext|>"  # noqa: S105 - a token of text, not a secret
    batch_docs: int = Field(256, ge=1, description="documents per encode_batch call")


class ShardConfig(StrictModel):
    shard_tokens: int = Field(50_000_000, ge=1024, description="tokens per shard (documents are never split)")
    val_fraction: float = Field(0.005, ge=0, lt=1, description="documents held out for validation, per partition")
    seed: int = 1234
    inputs_per_partition: int = Field(
        1, ge=1, description="consecutive inputs whose documents one shards task shuffles together and writes "
                             "as its own shards (more: fewer, larger shards; memory and local disk grow with it)")


class TraceIndexConfig(StrictModel):
    """The trace-index stage: an exact-match index (infini-gram suffix arrays) over the shards' tokens, one per
    group of shard_partitions_per_index shard partitions, that /v1/trace and the contamination report search
    (lmforge.trace)."""

    enabled: bool = Field(False, description="build the trace index (trace-index/ in the output): off, the stage "
                                             "has no tasks and the report writes nothing for it")
    splits: list[Literal["train", "val"]] = Field(
        default_factory=lambda: ["train"], min_length=1,
        description="the shard splits indexed (what the model trained on: train)")
    part_tokens: int = Field(
        25_000_000, ge=1024, description="tokens per suffix-array part: a partition larger than this is sorted in "
                                         "parts, then merged; a task's memory is about 20 bytes per part token")
    threads: int = Field(1, ge=1, description="threads of the suffix-array merge in each task")
    shard_partitions_per_index: int = Field(
        1, ge=1, description="consecutive shard partitions one trace-index task indexes as one index partition. "
                             "A query costs about the same per index partition whatever its size "
                             "(docs/benchmarks.md), so fewer, larger index partitions answer faster; a task's time "
                             "grows with it, its memory follows part_tokens")

    @field_validator("splits")
    @classmethod
    def _unique_splits(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"a split is listed more than once: {value}")
        return value


class _StepsBase(StrictModel):
    """`steps.<id>`: a field per built-in step (its defaults), and any further id whose `type` names
    its step type, validated by that type's settings."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    @model_validator(mode="after")
    def _extra_steps(self) -> _StepsBase:
        for step_id in BUILTIN_STEPS:
            settings_for(step_id, getattr(self, step_id))  # refuses a built-in id given another type
        for step_id, raw in list((self.__pydantic_extra__ or {}).items()):
            self.__pydantic_extra__[step_id] = settings_for(step_id, raw)
        return self


StepsConfig = create_model(
    "StepsConfig", __base__=_StepsBase, __doc__=_StepsBase.__doc__,
    **{name: (step_class(name).Settings, Field(default_factory=step_class(name).Settings))
       for name in BUILTIN_STEPS})

# the sections that became steps (issue 20), named in the error a config still using them gets
_MOVED_SECTIONS = {"langid": "steps.langid", "quality": "steps.gopher_quality",
                   "repetition": "steps.gopher_repetition", "pii": "steps.pii", "contamination": "steps.contamination"}


class DataprepConfig(StrictModel):
    reader: ReaderConfig = Field(default_factory=ReaderConfig)
    pipeline: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PIPELINE),
        description="the per-document steps, in order: built-in step names or ids configured under `steps`")
    steps: StepsConfig = Field(default_factory=StepsConfig, description="each step's settings, by step id")
    minhash: MinHashConfig = Field(default_factory=MinHashConfig)
    components: ComponentsConfig = Field(default_factory=ComponentsConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    shards: ShardConfig = Field(default_factory=ShardConfig)
    trace_index: TraceIndexConfig = Field(default_factory=TraceIndexConfig)
    reject_preview_chars: int = Field(300, ge=0, description="text kept with each rejected document for `sample`")
    parquet_row_group_docs: int = Field(2000, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _moved_sections(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in _MOVED_SECTIONS.items():
                if old in data:
                    raise ValueError(f"`{old}` is now `{new}` (the settings of that pipeline step)")
        return data

    @field_validator("pipeline")
    @classmethod
    def _unique_ids(cls, value: list[str]) -> list[str]:
        repeated = sorted({step_id for step_id in value if value.count(step_id) > 1})
        if repeated:
            raise ValueError(f"step ids appear more than once: {', '.join(repeated)} (give each instance its own id)")
        return value

    @model_validator(mode="after")
    def _steps_known(self) -> DataprepConfig:
        for step_id in self.pipeline:
            if self.step_settings(step_id) is None:
                settings_for(step_id, {})  # raises the error that names what is missing
        for step_id, settings in self.enabled_steps():
            settings.check_in_pipeline(step_id)
        return self

    def step_settings(self, step_id: str) -> StepSettings | None:
        """The settings of step `step_id`: its `steps.<id>` section, or a built-in's defaults."""
        settings = getattr(self.steps, step_id, None)
        return settings if isinstance(settings, StepSettings) else None

    def enabled_steps(self) -> list[tuple[str, StepSettings]]:
        """(id, settings) of each step the pipeline runs, in order."""
        return [(step_id, settings) for step_id in self.pipeline
                if (settings := self.step_settings(step_id)) is not None and settings.enabled]


def load_dataprep_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> DataprepConfig:
    return load_config(DataprepConfig, path, overrides, env_prefix=ENV_PREFIX)
