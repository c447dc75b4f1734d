#!/usr/bin/env python3
"""How much English the language filter loses, and how much non-English it keeps, on real
documentation labeled by language.

    .venv/bin/python bench/langid_eval.py [--workdir /tmp/lmforge-langid] [--json-out FILE]

The labeled set is built by bench/debian_docs.py from Debian packages (apt-get download +
dpkg -x, ~80 MB, reused from --workdir on later runs; the first run renders ~12,000 man
pages, about 20 minutes on 2 vCPUs). Every document goes through lmforge's LanguageFilter
once per method, at the same model (lid.176.ftz) and threshold: `whole_text`
(langid.prose_lines=false, sample_chars=0: the filter as it first was), `prose_lines`
(sample_chars=0: the whole text, identified again on its prose lines when it scores under the
threshold) and `sample_<n>` for each --sample-chars value (the first n characters of the prose
lines; the default). CPU seconds of the filter per method are printed too. Printed: per language, the
documents kept as English by each; for English, the documents lost; for the translated
packages' mixed and untranslated pages (not scored), the same counts apart. English "clean"
pages are those both of lmforge's Gopher filters keep.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from debian_docs import build_corpus  # noqa: E402

from lmforge.dataprep.document import Document  # noqa: E402
from lmforge.dataprep.steps.langid import LangIdConfig, LanguageFilter  # noqa: E402
from lmforge.dataprep.steps.quality import GopherQualityFilter, GopherRepetitionFilter  # noqa: E402

# the filter before sampling (whole text, prose lines when unsure), then the sampled identification
METHODS = {"whole_text": LangIdConfig(prose_lines=False, sample_chars=0),
           "prose_lines": LangIdConfig(sample_chars=0)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/lmforge-langid", help="Debian packages and extracted text (reused)")
    p.add_argument("--json-out", default=str(HERE / "out" / "langid_eval.json"))
    p.add_argument("--sample-chars", default=str(LangIdConfig().sample_chars),
                   help="comma-separated langid.sample_chars values to measure (the default's is the filter's)")
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    for size in map(int, args.sample_chars.split(",")):
        METHODS[f"sample_{size}"] = LangIdConfig(sample_chars=size)
    docs, meta = build_corpus(Path(args.workdir))
    steps = {name: LanguageFilter(config) for name, config in METHODS.items()}
    quality, repetition = GopherQualityFilter(), GopherRepetitionFilter()
    # group -> method -> Counter(kept_as_english=..., documents=...)
    groups: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    errors: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    seconds: Counter = Counter()
    translation = Counter()
    for doc in docs:
        status = doc.translation
        translation[(doc.language, status)] += 1
        keys = [doc.language if status in ("original", "translated") else f"{status} ({doc.language})"]
        if doc.language == "en":
            item = Document(0, doc.doc_id, doc.text)
            if quality.filter(item)[0] and repetition.filter(item)[0]:
                keys.append("en (clean)")
        elif status == "translated":
            keys.append("non-English")
        for name, step in steps.items():
            item = Document(0, doc.doc_id, doc.text)
            started = time.process_time()
            kept = step.filter(item)[0]
            seconds[name] += time.process_time() - started
            for key in keys:
                groups[key][name]["documents"] += 1
                groups[key][name]["english"] += kept
            wrong = kept != (doc.language == "en")
            if wrong and status in ("original", "translated"):
                errors[name][doc.language].append(
                    [doc.doc_id, item.metadata["language"], item.metadata["language_score"]])

    rows = {}
    for key in sorted(groups, key=lambda k: (k.startswith(("mixed", "untranslated")), k != "en",
                                             k != "en (clean)", k != "non-English", k)):
        by = groups[key]
        n = by["whole_text"]["documents"]
        english = {name: by[name]["english"] for name in METHODS}
        # English rows count the English lost, the others the documents kept as English
        wrong = {name: n - english[name] for name in METHODS} if key.startswith("en") else english
        rows[key] = {"documents": n, **{name: wrong[name] for name in METHODS},
                     **{f"{name}_share": round(wrong[name] / n, 4) for name in METHODS}}

    result = {
        "rows": rows,
        "meaning": "for en rows: English documents dropped; for the others: documents kept as English",
        "labels": {f"{lang}/{status}": n for (lang, status), n in sorted(translation.items())},
        "seconds": {name: round(value, 2) for name, value in seconds.items()},
        "errors": errors,
        "packages": meta["packages"],
        "short_documents_left_out": meta["short_documents"],
        "environment": {"python": platform.python_version(), "platform": platform.platform(),
                        "cpu_count": os.cpu_count()},
    }
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")

    print("| documents | n | " + " | ".join(METHODS) + " |")
    print("|---|---|" + "---|" * len(METHODS))
    for key, row in rows.items():
        what = "lost" if key.startswith("en") else "kept as English"
        cells = " | ".join(f"{row[name]:,} ({100 * row[f'{name}_share']:.1f}%)" for name in METHODS)
        print(f"| {key}: {what} | {row['documents']:,} | {cells} |")
    n_docs = len(docs)
    print("LanguageFilter CPU seconds per 1,000 documents: "
          + ", ".join(f"{name} {1000 * seconds[name] / n_docs:.2f}" for name in METHODS))
    print(f"details: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
