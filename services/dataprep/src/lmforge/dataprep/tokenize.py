"""BPE tokenizer (train on a sample of the cleaned corpus, or load one) and the
per-input tokenization stage.

The tokenizer is byte-level BPE without normalization, so decoding a document's tokens
gives back exactly its text. Every document is followed by the end-of-text token.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lmforge.common.errors import ConfigError, InputError
from lmforge.common.shards import token_dtype
from lmforge.common.store import Store, local_path_of, scheme_of
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig, TokenizerConfig
from lmforge.dataprep.dedup_global import KIND_REASONS, load_removed
from lmforge.dataprep.document import Document
from lmforge.dataprep.parquet_io import (
    REJECT_SCHEMA,
    ArrowRowWriter,
    ParquetRowWriter,
    column_or_default,
    iter_batches,
    open_arrow,
)
from lmforge.dataprep.stats import PeakRss, StepStats

TOKEN_INDEX_SCHEMA = pa.schema([
    ("doc_id", pa.uint64()),
    ("url", pa.string()),
    ("content_sha256", pa.string()),
    ("token_start", pa.uint64()),
    ("token_count", pa.uint64()),  # including the end-of-text token
    ("record_id", pa.string()),  # WARC-Record-ID, for lineage (last: an index written before it lacks it)
])


def _sample_order(n_inputs: int, seed: int) -> list[int]:
    """The inputs in an order keyed by the seed: the tokenizer's sample is read in this order."""
    def key(i: int) -> bytes:
        return hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest()

    return sorted(range(n_inputs), key=key)


def new_bpe_tokenizer(config: TokenizerConfig) -> tuple[Tokenizer, trainers.BpeTrainer]:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=[config.eot_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tokenizer, trainer


def iter_training_sample(store: Store, n_inputs: int, config: TokenizerConfig, seed: int) -> Iterator[str]:
    """Kept, non-duplicate documents of whole inputs, taken in an order keyed by the seed, until
    sample_bytes: the task reads about sample_bytes plus one input whatever the size of the crawl
    (a WET file is a random slice of it), and the sample is the same whatever the number of workers."""
    taken = 0
    for i in _sample_order(n_inputs, seed):
        removed, _ = load_removed(store, i)
        for batch in iter_batches(store, layout.docs(i), columns=["doc_id", "text"]):
            keep = ~np.isin(batch.column("doc_id").to_numpy(), removed)
            for text, ok in zip(batch.column("text").to_pylist(), keep.tolist()):
                if ok:
                    yield text
                    taken += len(text.encode("utf-8"))
                    if taken >= config.sample_bytes:
                        return


def prepare_tokenizer(store: Store, config: DataprepConfig, n_inputs: int) -> dict:
    """Train (or copy in) tokenizer.json; returns {path, sha256, vocab_size, eot_id, sample_bytes, seconds}."""
    if store.exists(layout.TOKENIZER) and store.exists(layout.TOKENIZER_STATS):
        return json.loads(store.read_text(layout.TOKENIZER_STATS))
    started = time.perf_counter()
    tok_config = config.tokenizer
    sample_bytes = 0
    if tok_config.path:
        raw = _read_given_tokenizer(tok_config.path)
        trained = False
    else:
        tokenizer, trainer = new_bpe_tokenizer(tok_config)
        sample = iter_training_sample(store, n_inputs, tok_config, config.shards.seed)

        def counted(texts):
            nonlocal sample_bytes
            for text in texts:
                sample_bytes += len(text.encode("utf-8"))
                yield text

        tokenizer.train_from_iterator(counted(sample), trainer=trainer)
        raw = tokenizer.to_str(pretty=False).encode("utf-8")
        trained = True
    tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    eot_id = tokenizer.token_to_id(tok_config.eot_token)
    if eot_id is None:
        raise ConfigError(f"tokenizer.eot_token: {tok_config.eot_token!r} is not in the tokenizer's vocabulary")
    store.write_bytes(layout.TOKENIZER, raw)
    info = {
        "path": layout.TOKENIZER,
        "sha256": hashlib.sha256(raw).hexdigest(),
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "eot_token": tok_config.eot_token,
        "eot_id": eot_id,
        "trained": trained,
        "sample_bytes": sample_bytes,
        "seconds": round(time.perf_counter() - started, 4),
    }
    store.write_text(layout.TOKENIZER_STATS, json.dumps(info, indent=1))
    return info


def _read_given_tokenizer(path: str) -> bytes:
    try:
        if scheme_of(path) == "file":
            raw = Path(local_path_of(path)).read_bytes()
        else:
            from lmforge.common.storage import open_input

            with open_input(path) as fh:
                raw = fh.read()
        Tokenizer.from_str(raw.decode("utf-8"))
    except (OSError, InputError, UnicodeDecodeError, Exception) as exc:
        raise ConfigError(f"tokenizer.path: cannot load tokenizer {path}: {exc}") from exc
    return raw


def load_tokenizer(store: Store) -> Tokenizer:
    return Tokenizer.from_str(store.read_text(layout.TOKENIZER))


def tokenize_input(store: Store, config: DataprepConfig, tokenizer_info: dict, input_index: int) -> dict:
    """Tokenize the kept, non-duplicate documents of one input; write their tokens, an
    index (doc → token range) and the dedup rejects of that input."""
    if store.exists(layout.tokenize_done(input_index)):
        return json.loads(store.read_text(layout.tokenize_stats(input_index)))
    peak = PeakRss()
    removed, removed_reasons = load_removed(store, input_index)
    started = time.perf_counter()
    tokenizer = load_tokenizer(store)
    dtype = token_dtype(tokenizer_info["vocab_size"])
    eot = tokenizer_info["eot_id"]
    stats = StepStats("global_dedup")
    tok_stats = StepStats("tokenize")
    token_cursor = 0
    group = config.parquet_row_group_docs
    with store.open_write(layout.tokens(input_index)) as token_file, \
         ArrowRowWriter(store, layout.token_index(input_index), TOKEN_INDEX_SCHEMA, group) as index, \
         ParquetRowWriter(store, layout.dedup_rejects(input_index), REJECT_SCHEMA, group) as rejects:
        columns = ["doc_id", "url", "text", "content_sha256", "record_id"]
        for batch in iter_batches(store, layout.docs(input_index), columns=columns,
                                  batch_rows=config.tokenizer.batch_docs, optional=("record_id",)):
            ids = batch.column("doc_id").to_numpy()
            urls = batch.column("url").to_pylist()
            texts = batch.column("text").to_pylist()
            hashes = batch.column("content_sha256").to_pylist()
            record_ids = column_or_default(batch, "record_id", "")
            positions = np.searchsorted(removed, ids)
            positions = np.minimum(positions, max(len(removed) - 1, 0))
            is_removed = (removed[positions] == ids) if len(removed) else np.zeros(len(ids), bool)
            keep_texts, keep_rows = [], []
            for row, (doc_id, url, text) in enumerate(zip(ids.tolist(), urls, texts)):
                nbytes = len(text.encode("utf-8"))
                stats.docs_in += 1
                stats.bytes_in += nbytes
                if is_removed[row]:
                    reason = KIND_REASONS[int(removed_reasons[positions[row]])]
                    stats.dropped[reason] += 1
                    stats.add_example("removed", Document(doc_id, url, text), reason)
                    rejects.add({"url": url, "stage": "global_dedup", "reason": reason, "doc_id": doc_id,
                                 "text_preview": text[: config.reject_preview_chars]})
                    continue
                stats.docs_out += 1
                stats.bytes_out += nbytes
                stats.add_example("kept", Document(doc_id, url, text))
                keep_texts.append(text)
                keep_rows.append(row)
            if not keep_texts:
                continue
            tick = time.perf_counter()
            # encode_batch_fast skips the character offsets, which nothing here uses
            encodings = tokenizer.encode_batch_fast(keep_texts, add_special_tokens=False)
            for row, text, encoding in zip(keep_rows, keep_texts, encodings):
                tokens = np.empty(len(encoding.ids) + 1, dtype=dtype)
                tokens[:-1] = encoding.ids
                tokens[-1] = eot
                token_file.write(tokens.tobytes())
                index.add({"doc_id": int(ids[row]), "url": urls[row], "content_sha256": hashes[row],
                           "token_start": token_cursor, "token_count": len(tokens), "record_id": record_ids[row]})
                token_cursor += len(tokens)
                tok_stats.docs_in += 1
                tok_stats.docs_out += 1
                tok_stats.bytes_in += len(text.encode("utf-8"))
                tok_stats.bytes_out += tokens.nbytes
            tok_stats.seconds += time.perf_counter() - tick
    tok_stats.counters["tokens"] = token_cursor
    summary = {"input_index": input_index, "tokens": token_cursor,
               "seconds": round(time.perf_counter() - started, 4), "peak_rss_bytes": peak.bytes(),
               "steps": [stats.to_dict(), tok_stats.to_dict()]}
    store.write_text(layout.tokenize_stats(input_index), json.dumps(summary, indent=1))
    store.write_text(layout.tokenize_done(input_index), "")
    return summary


def read_token_index(store: Store, input_index: int) -> pa.Table:
    """doc_id, url, content_sha256, token_start, token_count (and record_id, unless written before it) of
    one input (memory-mapped)."""
    return open_arrow(store, layout.token_index(input_index))
