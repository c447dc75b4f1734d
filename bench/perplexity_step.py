#!/usr/bin/env python3
"""Throughput of the perplexity step on one core: documents/s and MB/s of text for the kenlm
backend (a trigram model `train-ngram` estimates on half the documents) and the lmforge
backend (a model package of `--preset`, untrained weights: the cost does not depend on them,
its tokenizer a BPE trained on the documents), both through PerplexityFilter.run, torch on
one thread. Input: generated English documents (lmforge.sample_data). Results:
bench/out/perplexity-step.json and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def sample_texts(n_docs: int, seed: int) -> list[str]:
    from warcio.archiveiterator import ArchiveIterator

    from lmforge.sample_data.wet import write_sample_wet

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sample.warc.wet"
        write_sample_wet(path, n_docs, seed)
        with path.open("rb") as fh:
            return [r.content_stream().read().decode("utf-8", "replace") for r in ArchiveIterator(fh)
                    if r.rec_type == "conversion"]


def lmforge_package(texts: list[str], preset: str, vocab_size: int, out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from lmforge.model.config import GPTConfig
    from lmforge.model.package import write_package
    from lmforge.model.transformer import GPT

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(out / "tokenizer.json"))
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset(preset, vocab_size=tokenizer.get_vocab_size()))
    return write_package(model.eval(), out / "tokenizer.json", out / "package", step=0)


def measure(step, texts: list[str]) -> dict:
    from lmforge.dataprep.document import Document

    docs = [Document(doc_id=i, url="", text=text) for i, text in enumerate(texts)]
    started = time.perf_counter()
    kept = sum(1 for _ in step.run(docs))
    seconds = time.perf_counter() - started
    mb = sum(doc.nbytes for doc in docs) / 1e6
    return {"docs": len(docs), "kept": kept, "mb": round(mb, 3), "seconds": round(seconds, 3),
            "docs_per_s": round(len(docs) / seconds, 1), "mb_per_s": round(mb / seconds, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=2000, help="documents scored per backend")
    parser.add_argument("--preset", default="tiny", help="the lmforge backend's model preset")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--max-tokens", type=int, default=255)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lmforge-docs", type=int, default=400, help="documents for the lmforge backend "
                        "(at most --docs; it is ~400x slower)")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core

    import torch

    from lmforge.dataprep.steps.perplexity import PerplexityFilter, PerplexitySettings
    from lmforge.dataprep.train_ngram import train_ngram

    torch.set_num_threads(1)
    texts = sample_texts(2 * args.docs, seed=1)
    train, scored = texts[::2], texts[1::2][: args.docs]
    results = {"machine": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": 1}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in train))
        started = time.perf_counter()
        train_ngram([str(tmp / "train.jsonl")], str(tmp / "model.arpa"), order=3)
        results["train_ngram_seconds"] = round(time.perf_counter() - started, 2)
        kenlm_step = PerplexityFilter(PerplexitySettings(model_path=str(tmp / "model.arpa")))
        results["kenlm"] = measure(kenlm_step, scored)

        package = lmforge_package(train, args.preset, args.vocab_size, tmp)
        lm_step = PerplexityFilter(PerplexitySettings(
            model_path=str(package), backend="lmforge", batch_size=args.batch_size, max_tokens=args.max_tokens,
            device="cpu", torch_threads=1))
        results["lmforge"] = {"preset": args.preset, "max_tokens": args.max_tokens, "batch_size": args.batch_size,
                              **measure(lm_step, scored[: args.lmforge_docs])}

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "perplexity-step.json").write_text(json.dumps(results, indent=1))
    print("| backend | docs | MB | seconds | docs/s | MB/s |\n|---|---|---|---|---|---|")
    for name in ("kenlm", "lmforge"):
        r = results[name]
        label = f"lmforge ({args.preset}, {args.max_tokens} tokens)" if name == "lmforge" else "kenlm (trigram)"
        print(f"| {label} | {r['docs']} | {r['mb']} | {r['seconds']} | {r['docs_per_s']} | {r['mb_per_s']} |")


if __name__ == "__main__":
    main()
