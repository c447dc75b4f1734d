#!/usr/bin/env python3
"""Per-document agreement of lmforge's Gopher filters with datatrove's, on real documentation.

    bench/setup_datatrove_venv.sh
    .venv/bin/python bench/gopher_agreement.py [--workdir /tmp/lmforge-langid]

The documents are those of bench/debian_docs.py (real man pages and manuals, fetched from
Debian) that lmforge's language filter keeps: the documents that reach the Gopher stage.
Each goes through lmforge's GopherRepetitionFilter and GopherQualityFilter and through
datatrove's (bench/datatrove_gopher.py, run with the datatrove venv), all at the paper's
thresholds; the script prints the keep/drop agreement per filter and the reasons behind the
disagreements, and writes the details (document ids per disagreement) to --json-out.

datatrove's alphabetic-word rule counts punctuation tokens as words (its word list is
spaCy's tokens), where the paper counts words; the quality table is therefore also given
with that rule off on both sides. The repetition filter is also compared with datatrove's
run on whitespace-separated words, with overlapping duplicate n-grams counted once, and
both (bench/datatrove_gopher.py): what still differs then has another cause.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from debian_docs import build_corpus  # noqa: E402

from lmforge.dataprep.document import Document  # noqa: E402
from lmforge.dataprep.steps.langid import LanguageFilter  # noqa: E402
from lmforge.dataprep.steps.quality import (  # noqa: E402
    GopherQualityConfig,  # noqa: E402
    GopherQualityFilter,
    GopherRepetitionFilter,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/lmforge-langid", help="Debian packages and extracted text (reused)")
    p.add_argument("--json-out", default=str(HERE / "out" / "gopher_agreement.json"))
    p.add_argument("--datatrove-python", default=str(HERE / ".venv-datatrove" / "bin" / "python"))
    return p.parse_args(argv)


def agreement(ours: dict[str, str | None], theirs: dict[str, str | None]) -> dict:
    both_keep = both_drop = 0
    only_ours: Counter = Counter()
    only_theirs: Counter = Counter()
    examples: dict[str, list[str]] = {"lmforge_drops_only": [], "datatrove_drops_only": []}
    for doc_id, reason in ours.items():
        other = theirs[doc_id]
        if reason is None and other is None:
            both_keep += 1
        elif reason is not None and other is not None:
            both_drop += 1
        elif reason is not None:
            only_ours[reason] += 1
            examples["lmforge_drops_only"].append(doc_id)
        else:
            only_theirs[other] += 1
            examples["datatrove_drops_only"].append(doc_id)
    n = len(ours)
    return {
        "documents": n,
        "both_keep": both_keep,
        "both_drop": both_drop,
        "lmforge_drops_only": sum(only_ours.values()),
        "datatrove_drops_only": sum(only_theirs.values()),
        "agreement": round((both_keep + both_drop) / n, 4) if n else None,
        "lmforge_only_reasons": dict(only_ours.most_common()),
        "datatrove_only_reasons": dict(only_theirs.most_common()),
        "examples": examples,
    }


def main(args: argparse.Namespace) -> int:
    if not os.access(args.datatrove_python, os.X_OK):
        sys.exit(f"{args.datatrove_python} not found: run bench/setup_datatrove_venv.sh first")
    workdir = Path(args.workdir)
    docs, meta = build_corpus(workdir)
    langid = LanguageFilter()
    reaching = [doc for doc in docs if langid.filter(Document(0, doc.doc_id, doc.text))[0]]
    print(f"{len(docs)} documents, {len(reaching)} kept by language ID", file=sys.stderr)

    docs_path, verdicts_path = workdir / "gopher_docs.jsonl", workdir / "gopher_datatrove.jsonl"
    with open(docs_path, "w", encoding="utf-8") as fh:
        for doc in reaching:
            fh.write(json.dumps({"id": doc.doc_id, "text": doc.text}, ensure_ascii=False) + "\n")
    started = time.perf_counter()
    subprocess.run([args.datatrove_python, str(HERE / "datatrove_gopher.py"), str(docs_path), str(verdicts_path)],
                   check=True)
    datatrove_seconds = time.perf_counter() - started
    with open(verdicts_path, encoding="utf-8") as fh:
        theirs = {row["id"]: row for row in map(json.loads, fh)}

    steps = {
        "repetition": GopherRepetitionFilter(),
        "quality": GopherQualityFilter(),
        "quality_no_alpha": GopherQualityFilter(GopherQualityConfig(min_alpha_words_ratio=0.0)),
    }
    started = time.perf_counter()
    ours = {name: {doc.doc_id: step.filter(Document(0, doc.doc_id, doc.text))[1] for doc in reaching}
            for name, step in steps.items()}
    lmforge_seconds = time.perf_counter() - started
    tables = {name: agreement(ours[name], {i: row[name] for i, row in theirs.items()}) for name in steps}
    for variant in ("repetition_whitespace_words", "repetition_overlaps_once", "repetition_both"):
        tables[f"repetition vs datatrove {variant.removeprefix('repetition_')}"] = agreement(
            ours["repetition"], {i: row[variant] for i, row in theirs.items()})

    result = {
        "documents": len(reaching),
        "tables": tables,
        "seconds": {"lmforge": round(lmforge_seconds, 2), "datatrove": round(datatrove_seconds, 2)},
        "packages": meta["packages"],
        "environment": {"python": platform.python_version(), "platform": platform.platform(),
                        "cpu_count": os.cpu_count()},
    }
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    print("| filter | documents | both keep | both drop | lmforge only drops | datatrove only drops | agreement |")
    print("|---|---|---|---|---|---|---|")
    for name, t in tables.items():
        print(f"| {name} | {t['documents']:,} | {t['both_keep']:,} | {t['both_drop']:,} | "
              f"{t['lmforge_drops_only']:,} | {t['datatrove_drops_only']:,} | {t['agreement']:.4f} |")
    for name, t in tables.items():
        print(f"{name}: lmforge-only reasons {t['lmforge_only_reasons']}; "
              f"datatrove-only reasons {t['datatrove_only_reasons']}")
    print(f"details: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
