"""Drop documents that share a word n-gram with an evaluation set (13-grams by default,
after GPT-3's decontamination).

Text is normalized the same way on both sides: lowercased, everything that is not a word
character or whitespace deleted, split on whitespace. N-grams are identified by a 64-bit
hash that must be the same in every worker process, so Python's salted `hash()` cannot be
used: each distinct word is hashed once with BLAKE2b (cached), and an n-gram's hash is a
polynomial of its words' hashes modulo 2**64, computed for all positions of a document at
once with NumPy. An eval text shorter than n words (but at least `min_eval_words`) counts as one n-gram
of its own length; documents are checked for n-grams of those lengths too. Shorter eval
texts are skipped and counted (`short_eval_texts_skipped`).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import re
from dataclasses import dataclass
from itertools import filterfalse
from pathlib import Path, PurePosixPath

import numpy as np
from pydantic import Field, field_validator

from lmforge.common.errors import InputError
from lmforge.common.storage import open_input
from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings


class ContaminationConfig(StepSettings):
    eval_sets: list[str] = Field(default_factory=list, description="JSONL files with a 'text' field per line")
    ngram: int = Field(13, ge=1)
    text_field: str = "text"
    min_eval_words: int = Field(
        8, ge=1, description="eval texts with fewer words are ignored: a one-word answer would match everything"
    )

    @field_validator("eval_sets")
    @classmethod
    def _eval_sets_exist(cls, value: list[str]) -> list[str]:
        for path in value:
            if "://" not in path and not Path(path).exists():
                raise ValueError(f"eval set not found: {path}")
        return value

    @property
    def passes_everything(self) -> bool:
        return not self.eval_sets


_NOT_WORD_OR_SPACE = re.compile(r"[^\w\s]+")
# the ASCII characters that regex deletes, for the bytes.translate fast path of ASCII text
_ASCII_NOT_WORD_OR_SPACE = bytes(code for code in range(128) if not re.match(r"[\w\s]", chr(code)))
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd, so multiplication modulo 2**64 loses nothing
_WORD_CACHE_LIMIT = 1 << 18
_NO_HASHES = np.empty(0, dtype=np.uint64)


def normalized_words(text: str) -> list[str]:
    """Lowercase, delete every character that is neither a word character nor whitespace, split.

    Same result as `_NOT_WORD_OR_SPACE.sub("", text.lower()).split()` (but for lowercasing that
    depends on context, like the Greek final sigma, done here word by word), faster: the ASCII
    part is done with bytes operations and the regex only sees the few words with other characters.
    """
    ascii_cleaned = text.encode("utf-8").lower().translate(None, _ASCII_NOT_WORD_OR_SPACE)
    words = ascii_cleaned.decode("utf-8").split()
    if text.isascii():
        return words
    others = set(filterfalse(str.isascii, words))
    if not others:
        return words
    cleaned = {word: _NOT_WORD_OR_SPACE.sub("", word.lower()) for word in others}
    return " ".join(map(cleaned.get, words, words)).split()


class _WordHashes(dict):
    """word -> stable 64-bit hash, computed on first use."""

    def __missing__(self, word: str) -> int:
        if len(self) >= _WORD_CACHE_LIMIT:
            self.clear()
        value = self[word] = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")
        return value


class NgramHasher:
    """Stable hashes of the word n-grams of a text."""

    def __init__(self) -> None:
        self._word_hashes = _WordHashes()

    def word_hashes(self, words: list[str]) -> np.ndarray:
        return np.fromiter(map(self._word_hashes.__getitem__, words), dtype=np.uint64, count=len(words))

    @staticmethod
    def ngram_hashes(word_hashes: np.ndarray, n: int) -> np.ndarray:
        """Hash of the n-gram starting at each position (empty when there are fewer than n words)."""
        n_grams = len(word_hashes) - n + 1
        if n_grams <= 0:
            return _NO_HASHES
        hashes = word_hashes[:n_grams].copy()
        for offset in range(1, n):
            hashes *= _MULTIPLIER  # wraps modulo 2**64
            hashes += word_hashes[offset : offset + n_grams]
        return hashes


@dataclass
class EvalSet:
    name: str  # the file's stem
    hashes_by_length: dict[int, np.ndarray]  # n-gram length -> sorted unique hashes


def eval_set_name(path: str) -> str:
    """An eval set's name: its file's stem (`mmlu` for s3://bucket/evals/mmlu.jsonl.gz)."""
    return PurePosixPath(path.removesuffix(".gz")).stem


def read_eval_set(path: str, text_field: str = "text") -> list[tuple[int, dict]]:
    """The records of a JSONL eval set (a local path or any URI open_input reads; gzip when the name ends
    in .gz), each with its line number; blank lines are skipped. InputError names the file and the line of
    a record that is not a JSON object with a string `text_field`. (Also the contamination report's reader.)"""
    with contextlib.closing(open_input(path)) as stream:
        data = stream.read()
    if path.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise InputError(f"eval set {path}: not a valid gzip file ({exc})") from exc
    records = []
    for line_number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"eval set {path}, line {line_number}: not valid JSON ({exc})") from exc
        if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
            raise InputError(f"eval set {path}, line {line_number}: no string field {text_field!r}")
        records.append((line_number, record))
    return records


def _contains_any(sorted_hashes: np.ndarray, queries: np.ndarray) -> bool:
    if not len(sorted_hashes) or not len(queries):
        return False
    queries = np.sort(queries)  # sorted queries make searchsorted several times faster
    positions = np.searchsorted(sorted_hashes, queries)
    positions[positions == len(sorted_hashes)] = 0
    return bool((sorted_hashes[positions] == queries).any())


class ContaminationFilter(BaseFilter):
    """Drops (`contaminated`) every document sharing a word n-gram with any eval set, and
    counts the documents each set caught in `stats.counters["eval:<file stem>"]`."""

    type_name = "contamination"
    Settings = ContaminationConfig

    def __init__(self, config: ContaminationConfig | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.config = config or ContaminationConfig()
        self._hasher = NgramHasher()
        self.eval_sets: list[EvalSet] = [self._load(path) for path in self.config.eval_sets]
        # all sets merged per n-gram length, to clear a clean document with one lookup per length
        lengths = sorted({length for eval_set in self.eval_sets for length in eval_set.hashes_by_length})
        self._merged = {
            length: np.unique(
                np.concatenate([s.hashes_by_length[length] for s in self.eval_sets if length in s.hashes_by_length])
            )
            for length in lengths
        }

    def _load(self, path: str) -> EvalSet:
        """Read a JSONL eval set into its n-gram hashes."""
        n = self.config.ngram
        chunks: dict[int, list[np.ndarray]] = {}
        for _, record in read_eval_set(path, self.config.text_field):
            words = normalized_words(record[self.config.text_field])
            if len(words) < self.config.min_eval_words:
                self.stats.counters["short_eval_texts_skipped"] += 1
                continue
            length = min(n, len(words))
            word_hashes = self._hasher.word_hashes(words)
            chunks.setdefault(length, []).append(NgramHasher.ngram_hashes(word_hashes, length))
        hashes = {length: np.unique(np.concatenate(parts)) for length, parts in chunks.items()}
        return EvalSet(eval_set_name(path), hashes)

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        if not self._merged:
            return True, None
        words = normalized_words(doc.text)
        if not words:
            return True, None
        word_hashes = self._hasher.word_hashes(words)
        doc_hashes = {length: NgramHasher.ngram_hashes(word_hashes, length) for length in self._merged}
        if not any(_contains_any(self._merged[length], hashes) for length, hashes in doc_hashes.items()):
            return True, None
        for eval_set in self.eval_sets:
            if any(
                _contains_any(eval_set.hashes_by_length.get(length, _NO_HASHES), hashes)
                for length, hashes in doc_hashes.items()
            ):
                self.stats.counters[f"eval:{eval_set.name}"] += 1
        return False, "contaminated"

