#!/usr/bin/env python3
"""HTML main-text extraction: token precision/recall/F1 and pages/s per core of each extractor.

    .venv/bin/python bench/html_extraction.py [--repeat 3] [--json-out FILE]

The pages are tests/fixtures/html_extraction/ (built by bench/html_eval_build.py: real Debian
documentation text in six site templates full of boilerplate); each `<page>.html` comes with
`<page>.txt`, the main text placed in it. Tokens are whitespace-separated words compared as
multisets: precision = common tokens / extracted tokens, recall = common tokens / main-text
tokens, pooled over all pages (micro average); the per-template F1 and the worst page's F1 are
printed too. Speed: each extractor runs over every page `--repeat` times in this one process
(one core), on decoded `str` input; pages/s is pages over the best repeat's wall time.
"lmforge options" are the output options lmforge passes resiliparse (no list bullets, alt texts
or user-comment sections); the last row adds its boilerplate pruning (lmforge.dataprep.html_text).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

from lmforge.dataprep.html_text import make_extractor, token_scores

PAGES_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "html_extraction"


def resiliparse_library(main_content: bool):
    """resiliparse's extract_plain_text with its own defaults (bullets, alt texts, comment sections kept)."""
    from resiliparse.extract.html2text import extract_plain_text

    return lambda html: extract_plain_text(html, main_content=main_content)


EXTRACTORS = {  # label -> a factory of the extract(html) -> text function
    "resiliparse (library defaults)": lambda: resiliparse_library(False),
    "resiliparse main_content (library defaults)": lambda: resiliparse_library(True),
    "resiliparse main_content, lmforge options (no prune)": lambda: make_extractor(
        "resiliparse", main_content=True, prune_boilerplate=False),
    "trafilatura (default)": lambda: make_extractor("trafilatura", trafilatura_mode="balanced"),
    "trafilatura favor_precision": lambda: make_extractor("trafilatura", trafilatura_mode="precision"),
    "trafilatura favor_recall": lambda: make_extractor("trafilatura", trafilatura_mode="recall"),
    "lmforge default (resiliparse + prune_boilerplate)": lambda: make_extractor(
        "resiliparse", main_content=True, prune_boilerplate=True),
}


def load_pages(folder: Path = PAGES_DIR) -> list[tuple[str, str, str]]:
    """(name, html, main text) of every page, in name order."""
    return [(p.stem, p.read_text(encoding="utf-8"), p.with_suffix(".txt").read_text(encoding="utf-8"))
            for p in sorted(folder.glob("*.html"))]


def f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def evaluate(label: str, factory, pages, repeat: int) -> dict:
    extract = factory()
    common = got = want = 0
    per_template: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    worst = (1.0, "")
    for name, html, reference in pages:
        c, g, w = token_scores(extract(html), reference)
        common, got, want = common + c, got + g, want + w
        totals = per_template[name.split("-")[1]]
        totals[0] += c
        totals[1] += g
        totals[2] += w
        page_f1 = f1(c / g if g else 0.0, c / w if w else 0.0)
        worst = min(worst, (page_f1, name))
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _, html, _ in pages:
            extract(html)
        best = min(best, time.perf_counter() - started)
    precision, recall = common / got if got else 0.0, common / want
    return {
        "extractor": label, "precision": precision, "recall": recall, "f1": f1(precision, recall),
        "pages_per_s": len(pages) / best, "worst_page": worst[1], "worst_page_f1": worst[0],
        "f1_by_template": {t: f1(c / g if g else 0.0, c / w) for t, (c, g, w) in sorted(per_template.items())},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed passes over the pages (the best counts)")
    parser.add_argument("--json-out", help="also write the results as JSON")
    args = parser.parse_args(argv)
    pages = load_pages()
    words = sum(len(text.split()) for _, _, text in pages)
    html_mb = sum(len(html.encode()) for _, html, _ in pages) / 1e6
    results = [evaluate(label, factory, pages, args.repeat) for label, factory in EXTRACTORS.items()]
    templates = list(results[0]["f1_by_template"])
    machine = platform.processor() or platform.machine()
    print(f"{len(pages)} pages ({html_mb:.2f} MB of HTML, {words} main-text words), {machine}, "
          f"{os.cpu_count()} CPUs, one core, best of {args.repeat}\n")
    print("| Extractor | Precision | Recall | F1 | Worst page F1 | " + " | ".join(f"F1 {t}" for t in templates)
          + " | Pages/s per core |")
    print("| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in templates) + " | ---: |")
    for r in results:
        print(f"| {r['extractor']} | {r['precision']:.3f} | {r['recall']:.3f} | {r['f1']:.3f} | "
              f"{r['worst_page_f1']:.3f} | "
              + " | ".join(f"{r['f1_by_template'][t]:.3f}" for t in templates) + f" | {r['pages_per_s']:.0f} |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
