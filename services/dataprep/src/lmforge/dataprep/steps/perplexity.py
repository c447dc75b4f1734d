"""Perplexity filter: score each document with a small language model and keep a band.

CCNet (Wenzek et al. 2019, section 3.3) scores every document with a 5-gram KenLM model trained
on the language's Wikipedia and splits the crawl into head, middle and tail at the 30th and
60th percentiles of that perplexity; low perplexity is Wikipedia-like text. Here the band is
explicit perplexity cut-offs and/or CCNet buckets with their cut-offs in perplexity units
(compute the percentiles on a sample: the step's histogram in the report shows the
distribution). Backends: `kenlm` (perplexity_scorers.KenLMScorer, CCNet's normalization) and
`lmforge` (a model package lmforge trained, perplexity per token, batched)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterable, Iterator
from typing import Literal

from pydantic import Field, model_validator

from lmforge.common.errors import ConfigError
from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings, require_model

Bucket = Literal["head", "middle", "tail"]
# Log-spaced bins from 10 to 100 000 (4 per decade): CCNet's English head/tail cut-offs lie
# in the hundreds, garbage in the tens of thousands.
PERPLEXITY_EDGES = tuple(round(10 ** (1 + i / 4), 3) for i in range(17))


class PerplexitySettings(StepSettings):
    backend: Literal["kenlm", "lmforge"] = Field(
        "kenlm", description="kenlm: a KenLM n-gram model (.arpa or .bin, CCNet's method); lmforge: a model "
                             "package `lmforge-train export` wrote (perplexity per token of its tokenizer)")
    model_path: str | None = Field(
        None, description="the KenLM model file, or the lmforge model package directory (required); "
                          "`lmforge-dataprep train-ngram` trains a KenLM ARPA model")
    min_perplexity: float | None = Field(
        None, gt=0, description="drop documents under this perplexity (perplexity_too_low: repeated, "
                                "templated text)")
    max_perplexity: float | None = Field(
        None, gt=0, description="drop documents over this perplexity (perplexity_too_high)")
    bucket_cutoffs: tuple[float, float] | None = Field(
        None, description="[head/middle, middle/tail] perplexity cut-offs: CCNet uses the 30th and 60th "
                          "percentiles of the language's perplexities (Wenzek et al. 2019, section 3.3); "
                          "the bucket goes into the document's metadata")
    keep_buckets: list[Bucket] | None = Field(
        None, description="keep only these CCNet buckets (e.g. [head, middle]); others drop as bucket_<name>; "
                          "needs bucket_cutoffs")
    normalize: bool = Field(
        True, description="kenlm: normalize as CCNet before scoring (lowercase, accents removed, digits to 0, "
                          "punctuation to ASCII; cc_net/text_normalizer.py): the model's training text must be "
                          "normalized the same way")
    batch_size: int = Field(8, ge=1, description="lmforge: documents per forward pass")
    max_tokens: int = Field(
        512, ge=1, description="lmforge: score at most the first this many tokens of a document (and at most "
                               "the model's context length − 1)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="lmforge: auto is cuda when available")
    torch_threads: int = Field(
        1, ge=0, description="lmforge: torch CPU threads per data-prep process (0: torch's default); the "
                             "processes are the parallelism")

    @model_validator(mode="after")
    def _consistent(self) -> PerplexitySettings:
        if self.keep_buckets is not None and self.bucket_cutoffs is None:
            raise ValueError("keep_buckets needs bucket_cutoffs (the head/middle and middle/tail perplexities)")
        if self.bucket_cutoffs is not None and not 0 < self.bucket_cutoffs[0] <= self.bucket_cutoffs[1]:
            raise ValueError(f"bucket_cutoffs must be increasing positive perplexities, got {self.bucket_cutoffs}")
        if self.min_perplexity and self.max_perplexity and self.min_perplexity >= self.max_perplexity:
            raise ValueError("min_perplexity must be under max_perplexity")
        return self

    def check_in_pipeline(self, step_id: str) -> None:
        require_model(self.model_path, step_id, "a KenLM .arpa/.bin, `lmforge-dataprep train-ngram` trains one, "
                                                "or an lmforge model package")
        module, extra = ("kenlm", "kenlm") if self.backend == "kenlm" else ("torch", "model")
        if importlib.util.find_spec(module) is None:  # an image without the backend's library
            raise ValueError(f"steps.{step_id}: the {self.backend} backend needs the Python package {module!r} "
                             f"(pip install 'lmforge-dataprep[{extra}]')")


def bucket_of(perplexity: float, cutoffs: tuple[float, float]) -> Bucket:
    """CCNet's bucket (cc_net/perplexity.py PerplexityBucket): head under the first cut-off,
    tail from the second on, middle between."""
    if perplexity < cutoffs[0]:
        return "head"
    return "middle" if perplexity < cutoffs[1] else "tail"


class PerplexityFilter(BaseFilter):
    """Records the perplexity (scores[<step id>], a histogram in the report) and the CCNet
    bucket (metadata[<step id>_bucket]) of every document, and keeps the configured band."""

    type_name = "perplexity"
    Settings = PerplexitySettings

    def __init__(self, settings: PerplexitySettings | None = None, name: str | None = None):
        super().__init__(name)
        self.settings = settings or PerplexitySettings()
        self.score_edges = {self.name: PERPLEXITY_EDGES}
        self.scorer = self._scorer()
        self.keep = frozenset(self.settings.keep_buckets or ("head", "middle", "tail"))
        self._batch_scores: dict[int, float] = {}

    def _scorer(self):
        from lmforge.dataprep.perplexity_scorers import cached_scorer

        cfg = self.settings
        if not cfg.model_path:
            raise ConfigError(f"steps.{self.name}.model_path: required (a KenLM .arpa/.bin, or an lmforge model "
                              f"package directory)")
        return cached_scorer(self.name, cfg.backend, cfg.model_path, cfg.normalize, cfg.batch_size,
                             cfg.max_tokens, cfg.device, cfg.torch_threads)

    def run(self, docs: Iterable[Document], rank: int = 0, world_size: int = 1) -> Iterator[Document]:
        """Score `batch_size` documents at once, then filter them one by one."""
        batch: list[Document] = []
        for doc in docs:
            batch.append(doc)
            if len(batch) == self.settings.batch_size:
                yield from self._run_batch(batch, rank, world_size)
                batch = []
        if batch:
            yield from self._run_batch(batch, rank, world_size)

    def _run_batch(self, batch: list[Document], rank: int, world_size: int) -> Iterator[Document]:
        start = time.perf_counter()
        scores = self.scorer.perplexities([doc.text for doc in batch])
        self.stats.seconds += time.perf_counter() - start
        self._batch_scores = {id(doc): score for doc, score in zip(batch, scores)}
        yield from super().run(batch, rank, world_size)

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        cfg = self.settings
        perplexity = self._batch_scores.pop(id(doc), None)
        if perplexity is None:
            perplexity = self.scorer.perplexities([doc.text])[0]
        self.record_score(doc, self.name, perplexity)
        if cfg.bucket_cutoffs is not None:
            bucket = doc.metadata[f"{self.name}_bucket"] = bucket_of(perplexity, cfg.bucket_cutoffs)
            if bucket not in self.keep:
                return False, f"bucket_{bucket}"
        if cfg.max_perplexity is not None and perplexity > cfg.max_perplexity:
            return False, "perplexity_too_high"
        if cfg.min_perplexity is not None and perplexity < cfg.min_perplexity:
            return False, "perplexity_too_low"
        return True, None
