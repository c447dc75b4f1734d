#!/usr/bin/env python3
"""`make bench-quality-steps`: throughput per core of each document filter step, on the same corpus.

Two corpora: a generated Common Crawl-like WET (lmforge.sample_data: prose in nine languages,
boilerplate, spam, duplicates, PII) and the real text in the repository (the Common Crawl WET
record of tests/fixtures and the documentation pages of tests/dataprep/doc_excerpts), repeated to
a few MB. Every step gets its own fresh copies of all documents (language metadata set once by
langid beforehand, as the pipeline would), runs in this one process pinned to one core, and is
timed by CPU time. `url_filter` runs twice: with its built-in lists only, and with a generated
blocklist of --blocklist-domains domains (its load time printed apart).

Prints a Markdown table per corpus (docs/s, MB/s of UTF-8 text in, share of documents kept) and
writes bench/out/quality-steps.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "services" / "sample-data" / "src"))

from warcio.archiveiterator import ArchiveIterator  # noqa: E402

from lmforge.dataprep.document import Document  # noqa: E402
from lmforge.dataprep.step_registry import build_step, settings_for  # noqa: E402
from lmforge.sample_data.wet import write_sample_wet  # noqa: E402

NEW_STEPS = ["url_filter", "fineweb_quality", "c4_quality", "toxicity_words"]
REFERENCE_STEPS = ["url_dedup", "exact_dedup", "langid", "gopher_repetition", "gopher_quality", "pii"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=5000, help="generated documents (5000 ≈ 20 MB of text)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--real-mb", type=float, default=4.0, help="MB the real text is repeated up to")
    p.add_argument("--blocklist-domains", type=int, default=1_000_000)
    p.add_argument("--cpu", type=int, default=0, help="core the process is pinned to")
    p.add_argument("--out", default=str(REPO / "bench" / "out"))
    return p.parse_args()


def wet_documents(path: Path) -> list[Document]:
    docs = []
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh):
            if record.rec_type == "conversion":
                text = record.content_stream().read().decode("utf-8", errors="replace")
                docs.append(Document(len(docs), record.rec_headers.get_header("WARC-Target-URI"), text))
    return docs


def generated_corpus(docs: int, seed: int, tmp: Path) -> list[Document]:
    path = tmp / "generated.warc.wet"
    write_sample_wet(path, docs, seed)
    return wet_documents(path)


def real_corpus(target_mb: float) -> list[Document]:
    base = wet_documents(REPO / "tests" / "fixtures" / "whirlwind.warc.wet")
    for page in sorted((REPO / "tests" / "dataprep" / "doc_excerpts").glob("*.txt")):
        base.append(Document(0, f"https://docs.example/{page.stem}", page.read_text(encoding="utf-8")))
    size = sum(doc.nbytes for doc in base)
    copies = max(1, int(target_mb * 1e6 / size))
    # each copy at its own URL and id (exact_dedup drops the copies: its kept share here means nothing)
    return [Document(i * len(base) + j, f"{doc.url}?copy={i}", doc.text)
            for i in range(copies) for j, doc in enumerate(base)]


def fresh(docs: list[Document]) -> list[Document]:
    return [Document(d.doc_id, d.url, d.text, {k: v for k, v in d.metadata.items() if k != "scores"}) for d in docs]


def blocklist(tmp: Path, count: int) -> Path:
    path = tmp / "blocklist" / "adult" / "domains.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress("".join(f"blocked-site-{i}.example{i % 97}.com\n" for i in range(count)).encode(),
                                   compresslevel=1))
    return path.parents[1]


def measure(step_id: str, docs: list[Document]) -> dict:
    step = build_step(step_id, settings_for(step_id, {}))
    batch = fresh(docs)
    nbytes = sum(doc.nbytes for doc in batch)
    started = time.process_time()
    kept = sum(1 for _ in step.run(batch))
    seconds = time.process_time() - started
    return {"step": step_id, "docs": len(batch), "mb": nbytes / 1e6, "cpu_seconds": seconds,
            "docs_per_s": len(batch) / seconds, "mb_per_s": nbytes / 1e6 / seconds, "kept": kept / len(batch),
            "dropped": dict(step.stats.dropped.most_common(4))}


def run_corpus(name: str, docs: list[Document], ut1: Path) -> list[dict]:
    langid = build_step("langid", settings_for("langid", {}))
    for doc in docs:  # sets metadata["language"] on every document, for toxicity_words
        langid.filter(doc)
    rows = []
    for step_id in NEW_STEPS + REFERENCE_STEPS:
        rows.append(measure(step_id, docs))
        if step_id == "url_filter":
            rows.append(measure_with_blocklist(docs, ut1))
    for row in rows:
        row["corpus"] = name
    return rows


def measure_with_blocklist(docs: list[Document], ut1: Path) -> dict:
    from lmforge.dataprep.steps.url_filter import UrlFilter, UrlFilterSettings, _load_blocklists

    _load_blocklists.cache_clear()  # time the load itself, not the per-process cache
    started = time.process_time()
    step = UrlFilter(UrlFilterSettings(blocklist_dirs=[str(ut1)]), "url_filter")
    load_seconds = time.process_time() - started
    batch = fresh(docs)
    nbytes = sum(doc.nbytes for doc in batch)
    started = time.process_time()
    kept = sum(1 for _ in step.run(batch))
    seconds = time.process_time() - started
    return {"step": f"url_filter (+{len(step._domains):,} domains, loaded in {load_seconds:.2f} s)",
            "docs": len(batch), "mb": nbytes / 1e6, "cpu_seconds": seconds, "docs_per_s": len(batch) / seconds,
            "mb_per_s": nbytes / 1e6 / seconds, "kept": kept / len(batch), "load_seconds": load_seconds,
            "dropped": dict(step.stats.dropped.most_common(4))}


def table(rows: list[dict]) -> str:
    lines = ["| step | docs/s | MB/s | kept |", "| --- | ---: | ---: | ---: |"]
    for row in rows:
        marker = "**" if row["step"].split(" ")[0] in NEW_STEPS else ""
        lines.append(f"| {marker}{row['step']}{marker} | {row['docs_per_s']:,.0f} | {row['mb_per_s']:.1f} | "
                     f"{row['kept']:.0%} |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ut1 = blocklist(tmp, args.blocklist_domains)
        corpora = {"generated": generated_corpus(args.docs, args.seed, tmp), "real": real_corpus(args.real_mb)}
        results = []
        for name, docs in corpora.items():
            rows = run_corpus(name, docs, ut1)
            results.extend(rows)
            size = sum(doc.nbytes for doc in docs) / 1e6
            print(f"\n### {name} corpus: {len(docs):,} documents, {size:.1f} MB of text (one core, CPU time)\n")
            print(table(rows))
    (out / "quality-steps.json").write_text(json.dumps(
        {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
         "args": vars(args), "results": results}, indent=2))
    print(f"\nwritten: {out / 'quality-steps.json'}")


if __name__ == "__main__":
    main()
