"""The per-input stage: read → URL/exact dedup → language ID → Gopher repetition →
Gopher quality → PII → contamination → MinHash signatures.

One input file is one unit of work. Its outputs (kept documents, rejects, dedup keys: one
file with a section per dedup partition, a band partition's holding the signatures too, see
dedup_keys.py, stats) are written atomically and a completion marker last, so a killed run
redoes at most the inputs that were in flight, and a rerun skips finished ones.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from lmforge.common.store import Store
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.dedup_global import PartitionPlan, resolved_minhash_config
from lmforge.dataprep.dedup_keys import SIGNATURE_DTYPE, write_input_keys
from lmforge.dataprep.document import Document
from lmforge.dataprep.minhash import MinHasher
from lmforge.dataprep.parquet_io import DOC_SCHEMA, REJECT_SCHEMA, ParquetRowWriter
from lmforge.dataprep.stats import PeakRss
from lmforge.dataprep.step_base import BaseTransform, PipelineStep, chain
from lmforge.dataprep.step_registry import build_step
from lmforge.dataprep.steps.dedup import stable_hash64
from lmforge.dataprep.steps.reader import WetReader


def _unique_key(doc_id: int, column: int) -> int:
    return stable_hash64(f"{column}:{doc_id}".encode())


class MinHashStep(BaseTransform):
    """Records each kept document's signature and its dedup keys: LSH band keys, then the
    URL and content keys of the dedup steps (documents pass through unchanged)."""

    type_name = "minhash"

    def __init__(self, hasher: MinHasher):
        super().__init__()
        self.hasher = hasher
        self.doc_ids: list[int] = []
        self.signatures: list[np.ndarray] = []
        self.keys: list[np.ndarray] = []

    def transform(self, doc: Document) -> Document:
        signature = self.hasher.signature(doc.text)
        keys = np.empty(self.hasher.bands + 2, dtype=np.uint64)
        keys[: self.hasher.bands] = self.hasher.band_keys(signature)
        # without a url_dedup / exact_dedup step in the pipeline, a key no other document has
        # leaves that global dedup out too
        keys[-2] = doc.metadata.get("url_key", _unique_key(doc.doc_id, 1))
        keys[-1] = doc.metadata.get("content_key", _unique_key(doc.doc_id, 2))
        self.doc_ids.append(doc.doc_id)
        self.signatures.append(signature)
        self.keys.append(keys)
        return doc

    def _key_matrix(self) -> np.ndarray:
        return np.asarray(self.keys, dtype=np.uint64).reshape(len(self.doc_ids), self.hasher.bands + 2)

    def _signature_matrix(self) -> np.ndarray:
        return np.asarray(self.signatures, dtype=SIGNATURE_DTYPE).reshape(len(self.doc_ids),
                                                                          self.hasher.config.num_perm)

    def write_key_file(self, fh: BinaryIO, plan: PartitionPlan) -> None:
        """This input's key file: a section per dedup partition, a band partition's with the
        signatures of its documents (dedup_keys.py), written section by section."""
        write_input_keys(fh, np.asarray(self.doc_ids, dtype=np.uint64), self._key_matrix(), plan.sections(),
                         plan.partitions_per_band, self._signature_matrix(), plan.signed)


def build_filter_steps(config: DataprepConfig) -> list[PipelineStep]:
    """The config's pipeline: each enabled step with something to do (StepSettings.passes_everything), in order."""
    return [build_step(step_id, settings) for step_id, settings in config.enabled_steps()
            if not settings.passes_everything]


@dataclass
class InputResult:
    input_index: int
    uri: str
    seconds: float
    peak_rss_bytes: int
    input_bytes: int
    docs_kept: int
    skipped: bool = False


class _RejectRecorder:
    def __init__(self, writer: ParquetRowWriter, preview_chars: int):
        self.writer = writer
        self.preview_chars = preview_chars

    def __call__(self, doc: Document, stage: str, reason: str) -> None:
        self.writer.add({"url": doc.url, "stage": stage, "reason": reason, "doc_id": doc.doc_id,
                         "text_preview": doc.text[: self.preview_chars]})


def process_input(store: Store, config: DataprepConfig, uri: str, input_index: int,
                  hasher: MinHasher | None = None) -> InputResult:
    """Run the per-input stage for one input; skip it if it already completed."""
    if store.exists(layout.input_done(input_index)):
        stats = json.loads(store.read_text(layout.input_stats(input_index)))
        return InputResult(input_index, uri, 0.0, 0, stats["input_bytes"], stats["docs_kept"], skipped=True)
    started, peak = time.perf_counter(), PeakRss()
    reader = WetReader(config.reader)
    steps = build_filter_steps(config)
    minhash_step = MinHashStep(hasher or MinHasher(config.minhash))
    all_steps: list[PipelineStep] = [reader, *steps, minhash_step]
    group = config.parquet_row_group_docs
    with ParquetRowWriter(store, layout.filter_rejects(input_index), REJECT_SCHEMA, group) as rejects, \
         ParquetRowWriter(store, layout.docs(input_index), DOC_SCHEMA, group) as kept:
        recorder = _RejectRecorder(rejects, config.reject_preview_chars)
        for step in all_steps:
            step.reject_sink = recorder
        for doc in chain([*steps, minhash_step], reader.read(uri, input_index)):
            kept.add({
                "doc_id": doc.doc_id,
                "url": doc.url,
                "text": doc.text,
                "content_sha256": hashlib.sha256(doc.text.encode("utf-8")).hexdigest(),
                "language": doc.metadata.get("language", ""),
                "language_score": doc.metadata.get("language_score", 0.0),
                "warc_date": doc.metadata.get("warc_date", ""),
                "scores": doc.metadata.get("scores") or None,
                "record_id": doc.metadata.get("warc_record_id", ""),
            })
    plan = PartitionPlan.from_config(resolved_minhash_config(store, config.minhash))
    with store.open_write(layout.dedup_keys(input_index)) as fh:
        minhash_step.write_key_file(fh, plan)
    seconds = time.perf_counter() - started
    peak_rss = peak.bytes()
    input_bytes = int(reader.stats.counters.get("input_bytes", 0))
    summary = {
        "input": uri,
        "input_index": input_index,
        "input_bytes": input_bytes,
        "docs_kept": kept.rows,
        "seconds": round(seconds, 4),
        "peak_rss_bytes": peak_rss,
        "error": getattr(reader, "last_error", None),
        "steps": [step.stats.to_dict() for step in all_steps],
    }
    store.write_text(layout.input_stats(input_index), json.dumps(summary, indent=1))
    store.write_text(layout.input_done(input_index), "")
    return InputResult(input_index, uri, seconds, peak_rss, input_bytes, kept.rows)

