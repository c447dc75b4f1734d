"""`lmforge-dataprep train-ngram`: a KenLM-loadable ARPA model for the perplexity step, from
the sources text_sources.py reads: text files (.txt), JSON lines (.jsonl, .jsonl.gz: a text
field), Parquet files, data-prep outputs, folders and globs of them. Each line of each document
is a sentence, normalized as CCNet does (ccnet_text.py) unless told not to: the step scores the
same way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lmforge.common.errors import ConfigError, InputError
from lmforge.dataprep.ccnet_text import normalized_lines
from lmforge.dataprep.ngram_lm import NgramModel, estimate
from lmforge.dataprep.text_sources import read_texts


def sentences(sources: list[str], text_field: str, normalize: bool) -> Iterator[list[str]]:
    for source in sources:
        for text in read_texts(source, text_field):
            for line in normalized_lines(text, normalize):
                yield line.split()


def train_ngram(patterns: list[str], output: str, order: int = 3, text_field: str = "text",
                normalize: bool = True) -> NgramModel:
    if order < 1 or order > 6:
        raise ConfigError(f"train-ngram: --order must be 1 to 6, got {order}")
    try:
        model = estimate(sentences(patterns, text_field, normalize), order)
    except ValueError as exc:
        raise InputError(f"train-ngram: {exc}") from None
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    model.write_arpa(output)
    return model
