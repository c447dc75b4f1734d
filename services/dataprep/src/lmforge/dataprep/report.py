"""report.json (numbers) and report.html (the same, for people) from the per-stage stats."""

from __future__ import annotations

import json
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

import numpy as np

from lmforge.dataprep import layout
from lmforge.dataprep.stats import StepStats, merge_stats
from lmforge.dataprep.steps.reader import BAD_INPUT_PREFIX
from lmforge.dataprep.tokenize import read_token_index

if TYPE_CHECKING:
    from lmforge.dataprep.runner import Run

LENGTH_EDGES = [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def _package_version() -> str:
    try:
        return version("lmforge-dataprep")
    except PackageNotFoundError:
        return "unknown"


def _stage_entry(stats: StepStats) -> dict:
    entry = stats.to_dict()
    entry["cpu_seconds"] = entry["seconds"]
    entry["drop_rate"] = round(stats.docs_dropped / stats.docs_in, 6) if stats.docs_in else 0.0
    entry["docs_per_second"] = round(stats.docs_in / stats.seconds, 2) if stats.seconds else 0.0
    entry["mb_per_second"] = round(stats.bytes_in / 1e6 / stats.seconds, 3) if stats.seconds else 0.0
    return entry


def length_histogram(token_counts: np.ndarray) -> dict:
    edges = np.asarray(LENGTH_EDGES)
    counts = np.bincount(np.searchsorted(edges, token_counts, side="right") - 1, minlength=len(edges))
    return {"edges": LENGTH_EDGES, "counts": counts[: len(edges)].astype(int).tolist()}


def build_report(run: Run, wall_seconds: float | None = None) -> dict:
    store = run.store
    input_summaries = [json.loads(store.read_text(layout.input_stats(i))) for i in range(run.n_inputs)]
    tokenize_summaries = [json.loads(store.read_text(layout.tokenize_stats(i))) for i in range(run.n_inputs)]
    per_input = merge_stats([s["steps"] for s in input_summaries])
    global_steps = merge_stats([s["steps"] for s in tokenize_summaries])
    dedup = json.loads(store.read_text(layout.DEDUP_STATS))
    tokenizer = json.loads(store.read_text(layout.TOKENIZER_STATS))
    shards = json.loads(store.read_text(layout.SHARD_STATS))
    manifest = json.loads(store.read_text(layout.MANIFEST))

    by_name = {s.name: s for s in [*per_input, *global_steps]}
    if "global_dedup" in by_name:
        by_name["global_dedup"].seconds += dedup.get("seconds", 0.0)
    shard_stage = StepStats("shards", docs_in=shards["documents"], docs_out=shards["documents"],
                            seconds=shards["seconds"])
    shard_stage.counters["tokens"] = shards["tokens"]
    shard_stage.counters["shards"] = shards["shards"]
    stages = [*per_input, *global_steps, shard_stage]

    read = by_name["read"]
    bad_input = {k.removeprefix(BAD_INPUT_PREFIX): v for k, v in read.counters.items()
                 if k.startswith(BAD_INPUT_PREFIX)}
    for kind in ("truncated_gzip", "truncated_record", "bad_content_length", "corrupt_record", "corrupt_gzip",
                 "non_utf8", "empty_file", "unreadable"):
        bad_input.setdefault(kind, 0)
    languages = Counter({k.removeprefix("lang:"): v for k, v in by_name["langid"].counters.items()}
                        if "langid" in by_name else {})
    pii = dict(by_name["pii"].counters) if "pii" in by_name else {}
    contamination = dict(by_name["contamination"].counters) if "contamination" in by_name else {}
    token_counts = np.concatenate([read_token_index(store, i).column("token_count").to_numpy()
                                   for i in range(run.n_inputs)] or [np.zeros(0, np.uint64)])
    totals = manifest["totals"]
    input_bytes = int(read.counters.get("input_bytes", 0))
    kept = by_name.get("tokenize", StepStats("tokenize"))
    return {
        "title": "lmforge data-prep report",
        "output": store.uri,
        "generated_by": f"lmforge-dataprep {_package_version()}",
        "inputs": {"files": run.n_inputs, "bytes": input_bytes, "records": read.docs_in, "bad_input": bad_input},
        "stages": [_stage_entry(s) for s in stages],
        "languages": dict(languages.most_common()),
        "doc_length_tokens": length_histogram(token_counts.astype(np.int64)),
        "pii": pii,
        "contamination": contamination,
        "dedup": {"clusters": dedup["clusters"], "removed": dedup["removed"]},
        "tokenizer": {k: tokenizer[k] for k in ("sha256", "vocab_size", "eot_id", "trained")},
        "totals": {
            "input_bytes": input_bytes,
            "kept_docs": totals["documents"],
            "kept_bytes": kept.bytes_in,
            "output_tokens": totals["tokens"],
            "train_tokens": totals["train_tokens"],
            "val_tokens": totals["val_tokens"],
            "train_shards": sum(1 for s in manifest["shards"] if s["split"] == "train"),
            "val_shards": sum(1 for s in manifest["shards"] if s["split"] == "val"),
            "tokens_per_input_byte": round(totals["tokens"] / input_bytes, 6) if input_bytes else 0.0,
            "wall_seconds": round(wall_seconds, 3) if wall_seconds is not None else None,
            "vocab_size": tokenizer["vocab_size"],
            "tokenizer_seconds": tokenizer["seconds"],
        },
        "workers": [{"input": s["input"], "seconds": s["seconds"], "peak_rss_bytes": s["peak_rss_bytes"],
                     "error": s.get("error")} for s in input_summaries],
    }


def write_report(run: Run, wall_seconds: float | None = None) -> dict:
    from lmforge.dataprep.report_html import render_report_html

    report = build_report(run, wall_seconds)
    run.store.write_text(layout.REPORT_JSON, json.dumps(report, indent=1))
    run.store.write_text(layout.REPORT_HTML, render_report_html(report))
    return report
