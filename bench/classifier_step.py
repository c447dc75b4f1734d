#!/usr/bin/env python3
"""Throughput of the `classifier` step on one core, and fastText's predict time per text length.

    .venv/bin/python bench/classifier_step.py [--docs 4000] [--dim 100] [--json OUT.json]

Generates synthetic WET documents (lmforge.sample_data), trains a quality classifier on their
prose (hq) and spam (cc) with `train-classifier`'s code at DCLM's settings (dim 100, bigrams;
a smaller hash table than DCLM's 2M buckets, which changes the file size, not the work per
word), then runs ClassifierFilter over every document in this process, single-threaded, and
prints docs/s and MB/s of text in. The length table times one predict on the first N characters
of concatenated documents: it is what `max_chars` bounds.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator

from lmforge.dataprep.classifier_text import predict_probabilities
from lmforge.dataprep.classifier_training import ClassifierTrainingSettings, train_classifier
from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.classifier import ClassifierFilter, ClassifierSettings
from lmforge.sample_data.wet import write_sample_wet


def _documents(path: Path) -> dict[str, str]:
    with open(path, "rb") as fh:
        return {r.rec_headers.get_header("WARC-Target-URI"): r.content_stream().read().decode("utf-8")
                for r in ArchiveIterator(fh) if r.rec_type == "conversion"}


def _jsonl(path: Path, texts: list[str]) -> str:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=4000, help="synthetic documents generated and scored")
    parser.add_argument("--dim", type=int, default=100, help="model vector size (DCLM: 100)")
    parser.add_argument("--bucket", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3, help="passes over the documents (best one reported)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-classifier-") as tmp:
        root = Path(tmp)
        summary = write_sample_wet(root / "docs.warc.wet", args.docs, seed=5)
        texts = _documents(root / "docs.warc.wet")
        positives = [texts[r.url] for r in summary.records if r.kind == "prose"]
        negatives = [texts[r.url] for r in summary.records if r.kind in ("spam", "boilerplate")]
        settings = ClassifierTrainingSettings(dim=args.dim, bucket=args.bucket, threads=1, epoch=5)
        model_path = str(root / "quality.bin")
        train_classifier({"hq": [_jsonl(root / "hq.jsonl", positives)], "cc": [_jsonl(root / "cc.jsonl", negatives)]},
                         model_path, settings, io.StringIO())

        step = ClassifierFilter(ClassifierSettings(model_path=model_path, keep_if={"hq": 0.5}), "quality_classifier")
        docs = [Document(i, url, text) for i, (url, text) in enumerate(texts.items())]
        text_bytes = sum(doc.nbytes for doc in docs)
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            for doc in docs:
                step.filter(doc)
            best = min(best, time.perf_counter() - started)

        corpus = "\n".join(texts.values())
        by_length = {}
        for chars in (1_000, 10_000, 100_000):
            text = corpus[:chars]
            runs = max(5, 1_000_000 // chars)
            timings = []
            for _ in range(runs):
                started = time.perf_counter()
                predict_probabilities(step.model, text, None)
                timings.append(time.perf_counter() - started)
            by_length[chars] = round(sorted(timings)[len(timings) // 2] * 1e6, 1)  # the median: a noisy machine

    figures = {
        "docs": len(docs),
        "text_mb": round(text_bytes / 1e6, 3),
        "mean_doc_chars": round(sum(len(d.text) for d in docs) / len(docs)),
        "dim": args.dim,
        "seconds": round(best, 4),
        "docs_per_s": round(len(docs) / best),
        "mb_per_s": round(text_bytes / 1e6 / best, 2),
        "predict_us_by_chars": by_length,
    }
    print(f"classifier step, one core: {figures['docs_per_s']} docs/s, {figures['mb_per_s']} MB/s "
          f"({figures['docs']} docs, {figures['text_mb']} MB, mean {figures['mean_doc_chars']} chars, dim {args.dim})")
    for chars, micros in by_length.items():
        print(f"  predict on {chars:>7,} chars: {micros:>9,.1f} us  ({chars / micros:.1f} MB/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
