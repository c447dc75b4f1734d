"""`lmforge-dataprep train-classifier`: a fastText supervised classifier from labelled examples.

The DCLM recipe (Li et al. 2024, DataComp-LM, model-based quality filtering): positives from a curated
source (OpenHermes-2.5 instructions and Reddit ELI5 answers there, labelled `hq`), negatives from
raw crawl (`cc`), as many of one as of the other, a fastText model with word bigrams; documents
are later kept by P(__label__hq). Any labels work (quality, toxicity, domain): each label's
examples come from JSONL files (one object a line, the text under `text_field`) or data-prep
outputs (the docs Parquet files of an output directory, local or s3://, or one Parquet file).

Each label's examples are split, seeded, into training and held-out parts; the training part is
balanced, the model trained, and its precision, recall and F1 per label measured on the held-out
part (a table on stdout, and `<model>.report.json` beside the model file, with the held-out
examples in `<model>.heldout.jsonl` to check or inspect the model's mistakes).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Literal, TextIO

from pydantic import Field

from lmforge.common.config import StrictModel
from lmforge.common.errors import ConfigError, InputError, LmforgeError
from lmforge.common.storage import open_store
from lmforge.dataprep.classifier_text import (
    DEFAULT_MAX_CHARS,
    LABEL_PREFIX,
    classifier_text,
    predict_probabilities,
)
from lmforge.dataprep.text_sources import read_texts

DCLM = "DCLM (Li et al. 2024), baselines/train_fasttext_classifier.py"


class ClassifierTrainingSettings(StrictModel):
    text_field: str = Field("text", description="the JSONL field holding a document's text")
    holdout_fraction: float = Field(
        0.1, gt=0, lt=1, description="share of each label's examples held out to measure the model "
                                     f"(as --valid_frac in {DCLM})")
    seed: int = Field(0, description="seed of the held-out split, the balancing and fastText's training")
    balance: Literal["downsample", "upsample", "none"] = Field(
        "downsample", description="make the labels equally frequent in training: drop examples of the larger "
                                  "labels, repeat those of the smaller ones, or leave them (DCLM trained on equal "
                                  "numbers of positives and negatives)")
    min_examples: int = Field(10, ge=2, description="fewer examples of a label is an error")
    max_examples: int | None = Field(
        None, ge=1, description="read at most this many examples per label (default: all)")
    max_chars: int = Field(
        DEFAULT_MAX_CHARS, ge=1, description="characters of each document used, as the classifier step scores")
    epoch: int = Field(5, ge=1, description=f"fastText epochs ({DCLM}: 5)")
    lr: float = Field(0.1, gt=0, description=f"fastText learning rate ({DCLM}: 0.1)")
    dim: int = Field(100, ge=1, description=f"fastText vector size ({DCLM}: 100)")
    word_ngrams: int = Field(2, ge=1, description="fastText word n-grams (DCLM's OH-2.5+ELI5 classifier: bigrams)")
    bucket: int = Field(
        2_000_000, ge=1, description="fastText hash buckets of the word n-grams (fastText's and DCLM's default; "
                                     "the model holds bucket x dim floats: 800 MB at the defaults)")
    min_count: int = Field(1, ge=1, description=f"fastText minimum word count ({DCLM}: 1)")
    threads: int = Field(
        default_factory=lambda: os.cpu_count() or 1, ge=1,
        description="fastText training threads (1: the same model from the same seed and data)")
    quantize: bool = Field(False, description="also write a quantized model (.ftz), much smaller")
    quantize_cutoff: int = Field(
        100_000, ge=0, description="the quantized model keeps this many words and n-grams, the most important, "
                                   "and is retrained on them (fastText's quantization example; 0: all, slow)")


@dataclass
class LabelMetrics:
    label: str
    precision: float
    recall: float
    f1: float
    support: int  # held-out examples of the label


# ---------------------------------------------------------------- reading examples


def read_examples(uri: str, text_field: str = "text", limit: int | None = None) -> list[str]:
    """The texts of one source (text_sources.py: JSONL, Parquet, a data-prep output, ...), at most `limit`."""
    return list(islice(read_texts(uri, text_field), limit))


# ---------------------------------------------------------------- split, balance, train, measure


def split_examples(examples: dict[str, list[str]], settings: ClassifierTrainingSettings
                   ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each label's examples shuffled (seeded) into (training, held-out) parts."""
    rng = random.Random(settings.seed)
    train, heldout = {}, {}
    for label, texts in examples.items():
        if len(texts) < settings.min_examples:
            raise InputError(f"label {label!r} has {len(texts)} examples; at least {settings.min_examples} are needed")
        texts = list(texts)
        rng.shuffle(texts)
        n_heldout = max(1, round(len(texts) * settings.holdout_fraction))
        heldout[label], train[label] = texts[:n_heldout], texts[n_heldout:]
    return train, heldout


def balance(train: dict[str, list[str]], how: str, seed: int) -> dict[str, list[str]]:
    if how == "none":
        return train
    rng = random.Random(seed)
    sizes = [len(texts) for texts in train.values()]
    target = min(sizes) if how == "downsample" else max(sizes)
    balanced = {}
    for label, texts in train.items():
        if len(texts) >= target:
            balanced[label] = rng.sample(texts, target)
        else:  # upsample: every example as often, the remainder drawn at random
            repeats, extra = divmod(target, len(texts))
            balanced[label] = texts * repeats + rng.sample(texts, extra)
    return balanced


def _write_training_file(train: dict[str, list[str]], path: Path, max_chars: int, seed: int) -> int:
    lines = [f"{LABEL_PREFIX}{label} {classifier_text(text, max_chars)}\n"
             for label, texts in train.items() for text in texts]
    random.Random(seed).shuffle(lines)  # fastText's SGD reads the file in order
    path.write_text("".join(lines), encoding="utf-8")
    return len(lines)


def evaluate(model, heldout: dict[str, list[str]], max_chars: int | None) -> tuple[list[LabelMetrics], float]:
    """Precision, recall and F1 per label of the most probable label, and the accuracy."""
    predicted: list[tuple[str, str]] = []  # (true, predicted)
    for label, texts in heldout.items():
        for text in texts:
            probabilities = predict_probabilities(model, text, max_chars)
            predicted.append((label, max(probabilities, key=probabilities.get)))
    metrics = []
    for label in heldout:
        tp = sum(1 for true, guess in predicted if true == label and guess == label)
        n_predicted = sum(1 for _, guess in predicted if guess == label)
        support = len(heldout[label])
        precision = tp / n_predicted if n_predicted else 0.0
        recall = tp / support
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        metrics.append(LabelMetrics(label, round(precision, 4), round(recall, 4), round(f1, 4), support))
    accuracy = sum(1 for true, guess in predicted if true == guess) / len(predicted)
    return metrics, round(accuracy, 4)


def _train_files(train_file: Path, model_file: Path, quantized_file: Path | None,
                 settings: ClassifierTrainingSettings) -> None:
    """Train on `train_file` and save the model (and its quantized form); run in a child process."""
    import fasttext

    if not hasattr(fasttext, "train_supervised"):
        raise ConfigError("the installed `fasttext` module can only predict (fasttext-predict); "
                          "training needs fasttext-numpy2: pip install --force-reinstall --no-deps fasttext-numpy2")
    try:
        model = fasttext.train_supervised(
            input=str(train_file), epoch=settings.epoch, lr=settings.lr, dim=settings.dim,
            wordNgrams=settings.word_ngrams, bucket=settings.bucket, minCount=settings.min_count,
            thread=settings.threads, seed=settings.seed, verbose=0)
    except RuntimeError as exc:  # "Encountered NaN.": the learning rate diverged
        raise ConfigError(f"fastText training failed: {exc} (try a lower --lr)") from None
    model.save_model(str(model_file))
    if quantized_file is not None:
        model.quantize(input=str(train_file), retrain=True, qnorm=True, cutoff=settings.quantize_cutoff,
                       thread=settings.threads, verbose=0)
        model.save_model(str(quantized_file))


def _load(path: Path):
    import fasttext

    return fasttext.load_model(str(path))


def train_model(train_file: Path, model_file: Path, quantized_file: Path | None,
                settings: ClassifierTrainingSettings) -> None:
    """`_train_files` in a fresh process: fastText's bindings (fasttext-numpy2 0.10.4) fail with
    "Encountered NaN" on about every other training after the first in one process, on the same
    data and seed that train in a new process every time (tests/dataprep/test_classifier.py)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            pool.submit(_train_files, train_file, model_file, quantized_file, settings).result()
        except BrokenProcessPool:
            raise LmforgeError("the fastText training process died (out of memory? a smaller --bucket or "
                               "--dim makes a smaller model)") from None


# ---------------------------------------------------------------- writing


def report_path(model_uri: str) -> str:
    base = model_uri[: -len(".bin")] if model_uri.endswith(".bin") else model_uri
    return base + ".report.json"


def heldout_path(model_uri: str) -> str:
    base = model_uri[: -len(".bin")] if model_uri.endswith(".bin") else model_uri
    return base + ".heldout.jsonl"


def quantized_path(model_uri: str) -> str:
    base = model_uri[: -len(".bin")] if model_uri.endswith(".bin") else model_uri
    return base + ".ftz"


def _write_file(local: Path, uri: str) -> None:
    """Copy a finished local file to `uri` (a path or an s3:// URI), atomically."""
    parent, _, name = uri.rpartition("/")
    with open(local, "rb") as src, open_store(parent or ".").open_write(name) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def _write_text(uri: str, text: str) -> None:
    parent, _, name = uri.rpartition("/")
    open_store(parent or ".").write_text(name, text)


def format_table(metrics: list[LabelMetrics], accuracy: float) -> str:
    width = max(len("label"), *(len(m.label) for m in metrics))
    rows = [f"{'label':<{width}}  precision  recall     f1  support"]
    rows += [f"{m.label:<{width}}  {m.precision:9.4f}  {m.recall:6.4f}  {m.f1:5.4f}  {m.support:7d}" for m in metrics]
    rows.append(f"held-out accuracy: {accuracy:.4f}")
    return "\n".join(rows)


def _read_label(uris: list[str], settings: ClassifierTrainingSettings) -> list[str]:
    """One label's examples from all its sources, at most `max_examples`."""
    texts: list[str] = []
    for uri in uris:
        limit = None if settings.max_examples is None else settings.max_examples - len(texts)
        if limit is None or limit > 0:
            texts += read_examples(uri, settings.text_field, limit)
    return texts


def train_classifier(sources: dict[str, list[str]], output: str, settings: ClassifierTrainingSettings,
                     out: TextIO) -> dict:
    """Read each label's sources, train, measure on the held-out part, write the model (and the
    quantized one) and its report; print the table to `out`. Returns the report."""
    started = time.perf_counter()
    if len(sources) < 2:
        raise ConfigError("a classifier needs at least two labels (--label NAME=FILE twice, or "
                          "--positive and --negative)")
    if not output.endswith(".bin"):
        output += ".bin"
    examples = {label: _read_label(uris, settings) for label, uris in sources.items()}
    train, heldout = split_examples(examples, settings)
    train = balance(train, settings.balance, settings.seed)
    with tempfile.TemporaryDirectory(prefix="lmforge-classifier-") as tmp:
        train_file, local_model = Path(tmp) / "train.txt", Path(tmp) / "model.bin"
        local_quantized = Path(tmp) / "model.ftz" if settings.quantize else None
        n_train = _write_training_file(train, train_file, settings.max_chars, settings.seed)
        train_model(train_file, local_model, local_quantized, settings)
        metrics, accuracy = evaluate(_load(local_model), heldout, settings.max_chars)
        report = {
            "model": output,
            "heldout_examples": heldout_path(output),
            "labels": list(sources),
            "sources": sources,
            "examples": {label: len(texts) for label, texts in examples.items()},
            "train_examples": {label: len(texts) for label, texts in train.items()},
            "train_lines": n_train,
            "heldout": {"accuracy": accuracy, "labels": [vars(m) for m in metrics]},
            "settings": settings.model_dump(),
        }
        if local_quantized is not None:
            q_metrics, q_accuracy = evaluate(_load(local_quantized), heldout, settings.max_chars)
            report["quantized"] = {"model": quantized_path(output), "accuracy": q_accuracy,
                                   "labels": [vars(m) for m in q_metrics]}
            _write_file(local_quantized, quantized_path(output))
        report["seconds"] = round(time.perf_counter() - started, 2)
        _write_file(local_model, output)
    _write_text(heldout_path(output), "".join(json.dumps({"label": label, "text": text}, ensure_ascii=False) + "\n"
                                              for label, texts in heldout.items() for text in texts))
    _write_text(report_path(output), json.dumps(report, indent=1) + "\n")
    out.write(format_table(metrics, accuracy) + "\n")
    if settings.quantize:
        out.write(f"quantized ({quantized_path(output)}):\n{format_table(q_metrics, q_accuracy)}\n")
    out.write(f"model: {output}\nreport: {report_path(output)}\nheld-out examples: {heldout_path(output)}\n")
    return report
