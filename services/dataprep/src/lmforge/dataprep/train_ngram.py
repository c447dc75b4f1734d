"""`lmforge-dataprep train-ngram`: a KenLM-loadable ARPA model for the perplexity step, from
text files (.txt), JSON lines (.jsonl, .jsonl.gz: a text field) or Parquet files with a `text`
column (a data-prep output's work/docs/*.parquet). Each line of each document is a sentence,
normalized as CCNet does (ccnet_text.py) unless told not to: the step scores the same way."""

from __future__ import annotations

import glob
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from lmforge.common.errors import ConfigError, InputError
from lmforge.dataprep.ccnet_text import normalized_lines
from lmforge.dataprep.ngram_lm import NgramModel, estimate

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".json.gz", ".parquet")


def input_files(patterns: list[str]) -> list[Path]:
    """The files named, globbed, or (of the known kinds) under a directory named."""
    files: list[Path] = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        for name in found:
            path = Path(name)
            files += (sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
                      if path.is_dir() else [path])
    missing = [str(p) for p in files if not p.is_file()]
    if missing or not files:
        raise InputError(f"train-ngram: no such input file: {', '.join(missing) or ' '.join(patterns)}")
    return files


def documents(path: Path, text_field: str) -> Iterator[str]:
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        if text_field not in parquet.schema_arrow.names:
            raise InputError(f"{path}: no column {text_field!r}")
        for batch in parquet.iter_batches(columns=[text_field]):
            yield from (text for text in batch.column(0).to_pylist() if text)
    elif name.endswith((".jsonl", ".jsonl.gz", ".json.gz")):
        with (gzip.open(path, "rt", encoding="utf-8") if name.endswith(".gz") else path.open(encoding="utf-8")) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)[text_field]
                except (ValueError, KeyError, TypeError):
                    raise InputError(f"{path}:{number}: not a JSON object with a {text_field!r} string") from None
                yield text
    else:
        yield path.read_text(encoding="utf-8", errors="replace")


def sentences(files: list[Path], text_field: str, normalize: bool) -> Iterator[list[str]]:
    for path in files:
        for text in documents(path, text_field):
            for line in normalized_lines(text, normalize):
                yield line.split()


def train_ngram(patterns: list[str], output: str, order: int = 3, text_field: str = "text",
                normalize: bool = True) -> NgramModel:
    if order < 1 or order > 6:
        raise ConfigError(f"train-ngram: --order must be 1 to 6, got {order}")
    try:
        model = estimate(sentences(input_files(patterns), text_field, normalize), order)
    except ValueError as exc:
        raise InputError(f"train-ngram: {exc}") from None
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    model.write_arpa(output)
    return model
